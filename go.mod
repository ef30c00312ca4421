module github.com/resilienthttp/resilience

go 1.25.0

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
