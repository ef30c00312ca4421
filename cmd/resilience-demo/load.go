package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// stats is what one client saw.
type stats struct {
	name      string
	requests  int
	succeeded int
	p50, p99  time.Duration
	attempts  int // requests the upstream got (or, with -url, the client sent)
	newConns  int
	openings  int // EventCircuitOpened; -1 for the bare client
	retries   int // EventRetry; -1 for the bare client
	refused   int // EventBudgetExceeded: retries the retry budget refused; -1 for the bare client
	failures  map[string]int
}

func (s *stats) successRate() float64 { return float64(s.succeeded) / float64(s.requests) }

// measure sends cfg.N requests through one client, the bare one or the
// resilient one, against an upstream of its own (the embedded one, started
// afresh with the same script) or cfg.URL.
func measure(ctx context.Context, cfg config, resilient bool) (*stats, error) {
	var (
		srv   *resiliencetest.Server
		url   = cfg.URL
		dials atomic.Int64
		sent  atomic.Int64
	)
	if url == "" {
		srv = resiliencetest.NewServer(upstreamScript(cfg))
		defer srv.Close()
		url = srv.URL()
	}

	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	base := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		},
		MaxIdleConns:        100,
		MaxIdleConnsPerHost: cfg.C, // the default, 2, would churn connections under load
		IdleConnTimeout:     90 * time.Second,
	}
	defer base.CloseIdleConnections()
	counted := countingTransport{base, &sent}

	s := &stats{name: "bare", openings: -1, retries: -1, refused: -1}
	client := &http.Client{Transport: counted, Timeout: cfg.Options.TotalTimeout}
	var openings, retries, refused atomic.Int64
	if resilient {
		opts := cfg.Options
		opts.OnEvent = func(e resilience.Event) {
			switch e.Kind {
			case resilience.EventCircuitOpened:
				openings.Add(1)
			case resilience.EventRetry:
				retries.Add(1)
			case resilience.EventBudgetExceeded:
				refused.Add(1)
			}
		}
		rt, err := resilience.NewTransport(counted, opts)
		if err != nil {
			return nil, err
		}
		client = &http.Client{Transport: rt}
	}

	s.summarize(drive(ctx, client, url, cfg))
	if resilient {
		s.name, s.openings, s.retries, s.refused = "resilient", int(openings.Load()), int(retries.Load()), int(refused.Load())
	}
	if srv != nil {
		s.attempts, s.newConns = srv.Requests(), srv.NewConnections()
	} else {
		s.attempts, s.newConns = int(sent.Load()), int(dials.Load())
	}
	return s, nil
}

// countingTransport counts the requests it passes on.
type countingTransport struct {
	base http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.base.RoundTrip(r)
}

// result is the outcome of one request, as the caller saw it.
type result struct {
	latency time.Duration
	failure string // empty on success
}

// drive sends cfg.N GET requests to url through client from cfg.C workers,
// starting them at cfg.Rate per second (or as fast as the workers allow).
func drive(ctx context.Context, client *http.Client, url string, cfg config) []result {
	results := make([]result, cfg.N)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range cfg.C {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				results[i] = do(ctx, client, url)
			}
		}()
	}
	start := time.Now()
	for i := 0; i < cfg.N && ctx.Err() == nil; i++ {
		if cfg.Rate > 0 {
			at := start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
			if d := time.Until(at); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
				}
				t.Stop()
			}
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return results
}

// do sends one request and reads its response to the end.
func do(ctx context.Context, client *http.Client, url string) result {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return result{failure: "bad request"}
	}
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	r := result{latency: time.Since(start)}
	switch {
	case err != nil:
		r.failure = classify(err)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		r.failure = fmt.Sprint(resp.StatusCode)
	}
	return r
}

// circuitOpen is the kind of failure of a call the open circuit rejected.
const circuitOpen = "circuit open"

// classify names the kind of a failed request's error.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, resilience.ErrCircuitOpen):
		return circuitOpen
	case errors.Is(err, resilience.ErrRateLimited):
		return "rate limited"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, resilience.ErrAttemptTimeout), errors.Is(err, resilience.ErrTotalTimeout),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	}
	return "other error"
}

// summarize fills in the counts and latencies of results.
func (s *stats) summarize(results []result) {
	s.requests = len(results)
	s.failures = map[string]int{}
	lat := make([]time.Duration, 0, len(results))
	for _, r := range results {
		lat = append(lat, r.latency)
		if r.failure == "" {
			s.succeeded++
		} else {
			s.failures[r.failure]++
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	s.p50, s.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
}

// percentile is the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
