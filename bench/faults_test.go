package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// The faults experiment: every peer against the same flaky upstream.
//
// Each peer sends 2,000 GETs from 16 goroutines, open loop: request k starts
// at k/faultRate seconds, or as soon as a caller is free if all 16 were busy
// then. A closed loop would let a peer that fails fast (an open circuit)
// race through the rest of the requests and end its run early.
//
// The standard handler's durations are scaled down so that the whole
// experiment (two mixes, four peers, 2,000 requests each) takes about a
// minute; every peer gets the same scaled values, each where it has the knob:
//
//	                       default   here
//	AttemptTimeout          10s      200ms   (÷50)
//	TotalTimeout            30s      2s      (÷15)
//	Retry.Delay (base)      2s       20ms    (÷100)
//	Retry.MaxDelay          30s      200ms   (÷150)
//	Retry.MaxRetries        3        3
//	CB SamplingDuration     30s      3s      (÷10, ≥ 2×AttemptTimeout)
//	CB BreakDuration        5s       500ms   (÷10)
//	CB FailureRatio/MinimumThroughput  the defaults, unchanged (failsafehttp:
//	                                   .NET's 0.1 / 100)
//
// Retry-After on the 429s is "1" (one second), the smallest whole value that
// still asks for a wait: it is not scaled, because the header is what a real
// server sends, and half the scaled total timeout is a realistic ratio.
const (
	faultRequests       = 2000
	faultConcurrency    = 16
	faultSeed           = 3
	faultRate           = 400 // requests started per second, at most
	faultInterval       = time.Second / faultRate
	faultAttemptTimeout = 200 * time.Millisecond
	faultTotalTimeout   = 2 * time.Second
	faultRetryDelay     = 20 * time.Millisecond
	faultMaxRetryDelay  = 200 * time.Millisecond
	faultMaxRetries     = 3
	faultSampling       = 3 * time.Second
	faultBreak          = 500 * time.Millisecond
	faultRetryAfter     = "1"

	// Microsoft.Extensions.Http.Resilience's breaker, which failsafehttp
	// plays here: the .NET user's starting point.
	dotnetFailureRatio      = 0.1
	dotnetMinimumThroughput = 100
)

// A faultMix is a flaky upstream's script: a seeded mix of faults, the
// same sequence (by arrival order) for every peer. Weights are percentages
// of attempts. Keep README.md in step.
type faultMix struct {
	name                    string
	s503, s429, reset, hang float64 // the rest are 200s
}

var faultMixes = []faultMix{
	// flaky: 5 % of attempts fail, under the standard breaker's 10 %
	// failure ratio: this measures retries, connections and leaks. Hangs
	// (1.5 %) decide p99; the 429s' Retry-After waits (0.5 %) stay above it.
	{"flaky", 2, 0.5, 1, 1.5},
	// degraded: 20 % fail, well over it: this measures the breakers too.
	{"degraded", 10, 2, 4, 4},
}

func (m faultMix) script() *resiliencetest.Script {
	body503 := bytes.Repeat([]byte("upstream unavailable; "), 1024/22+1)[:1024]
	return resiliencetest.Mix(faultSeed,
		resiliencetest.Weighted{Weight: 100 - m.s503 - m.s429 - m.reset - m.hang, Fault: resiliencetest.Fault{}},
		resiliencetest.Weighted{Weight: m.s503, Fault: resiliencetest.Fault{Status: http.StatusServiceUnavailable, Body: body503}},
		resiliencetest.Weighted{Weight: m.s429, Fault: resiliencetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: faultRetryAfter}},
		resiliencetest.Weighted{Weight: m.reset, Fault: resiliencetest.Fault{Reset: true}},
		resiliencetest.Weighted{Weight: m.hang, Fault: resiliencetest.Fault{Hang: true}},
	)
}

// A faultPeer builds a client over base with the scaled configuration; it
// counts the openings of its circuit breaker, if it has one, in opens.
type faultPeer struct {
	name string
	new  func(base http.RoundTripper, opens *atomic.Int64) (*http.Client, error)
}

var faultPeers = []faultPeer{
	// bare: no retries; http.Client.Timeout is the total timeout.
	{"bare", func(base http.RoundTripper, _ *atomic.Int64) (*http.Client, error) {
		return &http.Client{Transport: base, Timeout: faultTotalTimeout}, nil
	}},
	// resilience: the standard handler with the scaled durations.
	{"resilience", func(base http.RoundTripper, opens *atomic.Int64) (*http.Client, error) {
		t, err := resilience.NewTransport(base, resilience.Options{
			TotalTimeout:   faultTotalTimeout,
			AttemptTimeout: faultAttemptTimeout,
			Retry: resilience.RetryOptions{
				MaxRetries: faultMaxRetries,
				Delay:      faultRetryDelay,
				MaxDelay:   faultMaxRetryDelay,
			},
			CircuitBreaker: resilience.CircuitBreakerOptions{
				SamplingDuration: faultSampling,
				BreakDuration:    faultBreak,
			},
			// the overload limiter's queue wait, scaled as the total timeout is
			Overload: resilience.OverloadOptions{MaxQueueWait: shipped().Overload.MaxQueueWait / 15},
			OnEvent: func(e resilience.Event) {
				if e.Kind == resilience.EventCircuitOpened {
					opens.Add(1)
				}
			},
		})
		if err != nil {
			return nil, err
		}
		return &http.Client{Transport: t}, nil
	}},
	// failsafehttp: the five policies of newFailsafe, scaled.
	{"failsafehttp", func(base http.RoundTripper, opens *atomic.Int64) (*http.Client, error) {
		is408 := func(resp *http.Response, err error) bool {
			return err == nil && resp != nil && resp.StatusCode == http.StatusRequestTimeout
		}
		policies := []failsafe.Policy[*http.Response]{
			bulkhead.New[*http.Response](uint(shipped().RateLimit.MaxConcurrent)),
			timeout.New[*http.Response](faultTotalTimeout),
			failsafehttp.NewRetryPolicyBuilder().
				HandleIf(is408).
				WithMaxRetries(faultMaxRetries).
				WithBackoff(faultRetryDelay, faultMaxRetryDelay).
				WithJitterFactor(0.5).
				Build(),
			circuitbreaker.NewBuilder[*http.Response]().
				HandleIf(transient).
				WithFailureRateThreshold(dotnetFailureRatio, dotnetMinimumThroughput, faultSampling).
				WithDelay(faultBreak).
				WithSuccessThreshold(1).
				OnOpen(func(circuitbreaker.StateChangedEvent) { opens.Add(1) }).
				Build(),
			timeout.New[*http.Response](faultAttemptTimeout),
		}
		return &http.Client{Transport: failsafehttp.NewRoundTripper(base, policies...)}, nil
	}},
	// retryablehttp: its inner http.Client's Timeout bounds each attempt
	// (the nearest it has to an attempt timeout), the outer client's
	// Timeout bounds the call (its context also cuts the waits short).
	{"retryablehttp", func(base http.RoundTripper, _ *atomic.Int64) (*http.Client, error) {
		c := retryablehttp.NewClient()
		c.HTTPClient = &http.Client{Transport: base, Timeout: faultAttemptTimeout}
		c.RetryMax = faultMaxRetries
		c.RetryWaitMin = faultRetryDelay
		c.RetryWaitMax = faultMaxRetryDelay
		c.Logger = nil
		sc := c.StandardClient()
		sc.Timeout = faultTotalTimeout
		return sc, nil
	}},
}

// faultResult is what one peer's run measured.
type faultResult struct {
	ok                      int           // 200 with the body read in full
	failStatus, failTimeout int           // a non-200 answer; a timeout error
	failOpen, failOther     int           // circuit open; any other error
	p50, p99                time.Duration // over every request, failed or not
	attempts                int           // requests the upstream received
	conns                   int           // TCP connections opened to it
	goroutines              int           // left after the run, over the baseline
	opens                   int64         // circuit openings
	wall                    time.Duration
}

// runFaults sends faultRequests GETs from faultConcurrency goroutines
// through p to a fresh flaky upstream, and measures.
func runFaults(tb testing.TB, mix faultMix, p faultPeer) faultResult {
	srv := resiliencetest.NewServer(mix.script())
	defer srv.Close()
	before := settledGoroutines(-1) // the server is up; nothing else of ours runs

	base := loopbackTransport()
	var opens atomic.Int64
	c, err := p.new(base, &opens)
	if err != nil {
		tb.Fatalf("%s: %v", p.name, err)
	}
	var (
		mu       sync.Mutex
		res      faultResult
		latency  = make([]time.Duration, 0, faultRequests)
		url      = srv.URL() + "/items"
		startAll = time.Now()
	)
	openLoop(faultRequests, faultConcurrency, startAll, faultInterval, func(int64) {
		start := time.Now()
		kind := faultCall(c, url)
		d := time.Since(start)
		mu.Lock()
		latency = append(latency, d)
		switch kind {
		case outcomeOK:
			res.ok++
		case outcomeStatus:
			res.failStatus++
		case outcomeTimeout:
			res.failTimeout++
		case outcomeOpen:
			res.failOpen++
		default:
			res.failOther++
		}
		mu.Unlock()
	})
	res.wall = time.Since(startAll)
	c.CloseIdleConnections()
	base.CloseIdleConnections()
	res.goroutines = settledGoroutines(before) - before
	res.attempts = srv.Requests()
	res.conns = srv.NewConnections()
	res.opens = opens.Load()
	slices.Sort(latency)
	res.p50 = latency[len(latency)*50/100]
	res.p99 = latency[len(latency)*99/100]
	return res
}

type outcome int

const (
	outcomeOK outcome = iota
	outcomeStatus
	outcomeTimeout
	outcomeOpen
	outcomeOther
)

// faultCall sends one GET, reads the body to EOF, closes it, and classifies
// the outcome.
func faultCall(c *http.Client, url string) outcome {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return outcomeOther
	}
	resp, err := c.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return classify(resp, err)
}

// classify says how a call ended, given its response and its error, the
// error of reading the body included.
func classify(resp *http.Response, err error) outcome {
	var ne net.Error
	switch {
	case err == nil && resp.StatusCode == http.StatusOK:
		return outcomeOK
	case err == nil:
		return outcomeStatus
	case errors.Is(err, resilience.ErrCircuitOpen), errors.Is(err, circuitbreaker.ErrOpen):
		return outcomeOpen
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, timeout.ErrExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return outcomeTimeout
	}
	return outcomeOther
}

// settledGoroutines polls runtime.NumGoroutine every 10 ms for up to 2 s
// until it is at most floor (never, for a negative floor) or has not changed
// for 100 ms, and returns it: goroutines that are on their way out (a
// connection's reader seeing EOF, a timer's function) get time to end, a
// leak does not end the wait early.
func settledGoroutines(floor int) int {
	n, same := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if floor >= 0 && n <= floor {
			return n
		}
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			if same++; same >= 10 {
				return n
			}
		} else {
			n, same = m, 0
		}
	}
	return n
}

// BenchmarkFaults runs the faults experiment once per peer, whatever b.N
// (run it with -benchtime 1x), and reports what it measured as custom
// metrics; ns/op is the wall time of the whole run. It takes about a minute
// on 2 cores, which is why it is a benchmark: go test without -bench skips
// it.
func BenchmarkFaults(b *testing.B) {
	for _, mix := range faultMixes {
		for _, p := range faultPeers {
			b.Run("mix="+mix.name+"/peer="+p.name, func(b *testing.B) {
				r := runFaults(b, mix, p)
				b.ReportMetric(float64(r.wall.Nanoseconds())/float64(b.N), "ns/op")
				b.ReportMetric(100*float64(r.ok)/faultRequests, "success-%")
				b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(r.attempts)/faultRequests, "attempts/req")
				b.ReportMetric(float64(r.conns), "new-conns")
				b.ReportMetric(float64(r.goroutines), "goroutines-left")
				b.ReportMetric(float64(r.opens), "circuit-opens")
				b.ReportMetric(float64(r.failStatus), "fail-status")
				b.ReportMetric(float64(r.failTimeout), "fail-timeout")
				b.ReportMetric(float64(r.failOpen), "fail-open")
				b.ReportMetric(float64(r.failOther), "fail-other")
			})
		}
	}
}

// openLoop makes n calls from conc goroutines, open loop: call k (from 1)
// starts at begin+(k-1)*interval, or at once if every caller was busy then.
// It returns when every call has returned.
func openLoop(n int64, conc int, begin time.Time, interval time.Duration, call func(k int64)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1)
				if k > n {
					return
				}
				if d := time.Until(begin.Add(time.Duration(k-1) * interval)); d > 0 {
					time.Sleep(d)
				}
				call(k)
			}
		}()
	}
	wg.Wait()
}
