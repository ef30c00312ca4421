package bench

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// The failover experiment (issue 29, item 4): Options.Endpoints [A, B],
// A a loopback port that refuses connections (listened on, then closed), B
// a healthy httptest server; every other option a default (retry delay 2 s
// ±50%, 3 retries, the breaker, the budget). Sequential GETs, one at a
// time (low traffic), FAILOVER_CALLS of them (default 300): latency per
// call, attempts per call, and how many calls found A's circuit open; then
// the same with the circuit breaker off, where every call fails over.
// Before the fix each call waited the backoff before trying B, and A's
// circuit never saw its 100 attempts within its 30 s window.
func BenchmarkFailoverRefused(b *testing.B) {
	calls := 300
	if s := os.Getenv("FAILOVER_CALLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("FAILOVER_CALLS=%q: want a positive count", s)
		}
		calls = n
	}
	var s strings.Builder
	fmt.Fprintf(&s, "%d sequential GETs per row; Endpoints [A refusing connections, B healthy], defaults otherwise.\n\n", calls)
	s.WriteString("| options | p50 ms | p99 ms | max ms | attempts/call | attempts on A | A's circuit rejected | B's requests | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, breakerOff := range []bool{false, true} {
		name := "defaults"
		if breakerOff {
			name = "defaults, breaker off"
		}
		b.Run("options="+strings.ReplaceAll(name, " ", ""), func(b *testing.B) {
			r := failover(b, calls, breakerOff)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(r.p50), "p50-ms")
			b.ReportMetric(ms(r.p99), "p99-ms")
			b.ReportMetric(ms(r.max), "max-ms")
			b.ReportMetric(r.attempts, "attempts/call")
			b.ReportMetric(float64(r.failed), "failed")
			fmt.Fprintf(&s, "| %s | %.2f | %.2f | %.2f | %.3f | %d | %d | %d | %d |\n", name, ms(r.p50), ms(r.p99), ms(r.max),
				r.attempts, r.attemptsA, r.rejectedA, r.hitsB, r.failed)
		})
	}
	b.Log("\n" + s.String())
	if dir := os.Getenv("BENCH_RESULTS"); dir != "" {
		name := os.Getenv("FAILOVER_NAME")
		if name == "" {
			name = "failover.md"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

type failoverResult struct {
	p50, p99, max        time.Duration
	attempts             float64 // per call
	attemptsA, rejectedA int64
	hitsB                int64
	failed               int
}

func failover(b *testing.B, calls int, breakerOff bool) failoverResult {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	refusing := "http://" + l.Addr().String()
	l.Close()
	healthy, hits := replicaServer(0, func() bool { return false })
	defer healthy.Close()

	var attemptsA, rejectedA, attempts atomic.Int64
	opts := resilience.Options{
		Endpoints: []resilience.Endpoint{{URL: refusing}, {URL: healthy.URL}},
		OnEvent: func(e resilience.Event) {
			switch {
			case e.Kind == resilience.EventAttempt:
				attempts.Add(1)
				if e.Endpoint == refusing {
					attemptsA.Add(1)
				}
			case e.Kind == resilience.EventCircuitRejected && e.Endpoint == refusing:
				rejectedA.Add(1)
			}
		},
	}
	opts.CircuitBreaker.Disabled = breakerOff
	t, err := resilience.NewTransport(loopbackTransport(), opts)
	if err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Transport: t}
	defer c.CloseIdleConnections()
	lat, failed := closedLoop(c, calls, 1, "http://orders.invalid/items")
	slices.Sort(lat)
	return failoverResult{
		p50: quantile(lat, 0.5), p99: quantile(lat, 0.99), max: lat[len(lat)-1],
		attempts:  float64(attempts.Load()) / float64(calls),
		attemptsA: attemptsA.Load(), rejectedA: rejectedA.Load(), hitsB: hits.Load(), failed: failed,
	}
}
