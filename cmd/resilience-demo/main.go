// Command resilience-demo shows what the standard resilience handler does
// against a flaky upstream. It sends the same requests through a bare
// http.Client and through resilience.NewTransport, and prints a side-by-side
// table: success rate, latency, upstream attempts, new connections, circuit
// openings, retries and the retries the retry budget refused.
//
// By default the upstream is embedded: a resiliencetest.Server on loopback
// that plays a seeded mix of 503s, 429s with Retry-After, hangs and
// connection resets. It runs two scenarios: the flaky upstream alone, where
// retries turn failures into successes, then the same with an outage in the
// middle, where the retry budget stops retrying once retries keep failing
// rather than multiply the load on a down upstream, and retries still
// recover the flaky upstream's failures around it. With -url the requests
// go to a real upstream instead, in one scenario.
//
//	go run ./cmd/resilience-demo [-n 250] [-c 32] [-rate 150] [-seed 1] [-outage 300ms] [-url URL]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/resilienthttp/resilience"
)

// config is what one run of the demo does.
type config struct {
	URL  string  // a real upstream; empty for the embedded one
	N    int     // requests per client
	C    int     // concurrent workers per client
	Rate float64 // requests started per second per client; 0 as fast as the workers go
	Seed uint64  // the embedded upstream's seed

	// Outage is how long the embedded upstream answers every request with
	// a 503, from 40% of the way into a client's run; 0 for none.
	Outage time.Duration

	// Title heads the scenario's output; Brief leaves out the clients'
	// description, said by an earlier scenario.
	Title string
	Brief bool

	// Options configures the resilient client. Its TotalTimeout is also
	// the bare client's http.Client.Timeout.
	Options resilience.Options
}

// demoOptions are the standard handler's defaults with every duration
// shortened, so that the demo runs in seconds: the defaults are sized for
// production (2s retry delay, 10s attempt and 30s total timeouts, a breaker
// that samples 30s). Ratios, thresholds and the retry budget are the
// defaults themselves.
func demoOptions() resilience.Options {
	shipped := defaults()
	return resilience.Options{
		Name:           "demo",
		TotalTimeout:   3 * time.Second,
		AttemptTimeout: 300 * time.Millisecond,
		Retry: resilience.RetryOptions{
			Delay:    50 * time.Millisecond,
			MaxDelay: 500 * time.Millisecond,
		},
		CircuitBreaker: resilience.CircuitBreakerOptions{
			SamplingDuration: shipped.CircuitBreaker.SamplingDuration / 10,
			BreakDuration:    shipped.CircuitBreaker.BreakDuration / 10,
		},
	}
}

// defaults returns the standard handler's options, every default filled
// in, so that the demo's scaled ones follow a changed default.
func defaults() resilience.Options {
	h, _ := resilience.NewHandler(resilience.Options{}) // the defaults are valid
	return h.Options()
}

func main() {
	cfg := config{Options: demoOptions()}
	flag.StringVar(&cfg.URL, "url", "", "send the requests to this upstream instead of the embedded flaky one")
	flag.IntVar(&cfg.N, "n", 250, "requests per client, per scenario")
	flag.IntVar(&cfg.C, "c", 32, "concurrent workers per client: the most requests in flight")
	flag.Float64Var(&cfg.Rate, "rate", 150, "requests started per second per client (0: as fast as the workers go)")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed of the embedded upstream's fault mix")
	flag.DurationVar(&cfg.Outage, "outage", 300*time.Millisecond, "how long the embedded upstream is down, 40% into each run (0: never)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	scenarios := []config{cfg}
	if cfg.URL == "" && cfg.Outage > 0 {
		flaky, outage := cfg, cfg
		flaky.Outage, flaky.Title = 0, "scenario 1: a flaky upstream"
		outage.Title, outage.Brief = "scenario 2: the same upstream, down for "+cfg.Outage.String()+" in the middle", true
		scenarios = []config{flaky, outage}
	}
	for i, sc := range scenarios {
		if i > 0 {
			fmt.Println()
		}
		if _, err := run(ctx, sc, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "resilience-demo:", err)
			os.Exit(1)
		}
	}
}

// run runs the demo and writes its report to w.
func run(ctx context.Context, cfg config, w io.Writer) (*report, error) {
	switch {
	case cfg.N <= 0:
		return nil, fmt.Errorf("-n must be positive, not %d", cfg.N)
	case cfg.C <= 0:
		return nil, fmt.Errorf("-c must be positive, not %d", cfg.C)
	case cfg.Rate < 0:
		return nil, fmt.Errorf("-rate must not be negative, not %g", cfg.Rate)
	case cfg.Outage < 0:
		return nil, fmt.Errorf("-outage must not be negative, not %v", cfg.Outage)
	}
	// Validate the options before anything runs.
	if _, err := resilience.NewHandler(cfg.Options); err != nil {
		return nil, err
	}
	start := time.Now()
	printSetup(w, cfg)

	rep := &report{}
	for _, resilient := range []bool{false, true} {
		s, err := measure(ctx, cfg, resilient)
		if err != nil {
			return nil, err
		}
		rep.clients = append(rep.clients, s)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rep.elapsed = time.Since(start)
	rep.print(w)
	return rep, nil
}
