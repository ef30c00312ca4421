// Package bench holds the benchmarks that compare the resilience standard
// handler with a bare transport and with the Go libraries users would
// otherwise pick: failsafe-go's failsafehttp and hashicorp/go-retryablehttp.
//
// Besides the per-request benchmarks it holds four experiments, run once per
// round as benchmarks: the same flaky upstream for every peer
// (BenchmarkFaults), a herd of instances retrying after an outage
// (BenchmarkHerd), hedging against an upstream that pauses a fifth of its
// requests (BenchmarkHedging), and the retry budget against an upstream
// that fails every request (BenchmarkRetryBudget).
//
// It is a module of its own so that the peers never enter the dependencies
// of github.com/resilienthttp/resilience. Run everything with ./run.sh; see
// README.md for what each benchmark measures and the latest results.
package bench
