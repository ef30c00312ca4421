module github.com/resilienthttp/resilience

go 1.24

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/failsafe-go/failsafe-go v0.9.8
)

require github.com/bits-and-blooms/bitset v1.24.4 // indirect
