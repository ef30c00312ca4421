package bench

import (
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// The hedging experiment (seed exercise 5, issue 5): an upstream where 20 %
// of the requests it receives pause for hedgePause before answering and the
// rest answer at once, called hedgeRequests times from hedgeConcurrency
// goroutines in a closed loop, through the standard handler without hedging
// and through the standard hedging handler with one hedge after hedgeDelay
// (and, to tell the retry budget's share of the result, the same without
// the budget).
//
// Which arrivals pause is decided by arrival order, so hedges are arrivals
// like any other and pause as often: every 5th arrival, or a seeded
// resiliencetest.Mix drawing 20 % at random. A third schedule is the best
// case for hedging: the first attempt of every 5th call pauses, a second
// attempt of the same call never does (a slow replica the hedge avoids);
// the client numbers its calls in the query (?k=) for the upstream to tell.
// A paused request ends early, counted as cancelled, when its client goes
// away (a hedge that lost closes its connection).
//
// Nothing fails here, so retries and the breaker never act: every peer
// keeps the default timeouts (attempt 10s, total 30s), which the pause
// never reaches.
const (
	hedgeRequests    = 500
	hedgeConcurrency = 8
	hedgePause       = time.Second
	hedgeDelay       = 300 * time.Millisecond
	hedgeSeed        = 5
)

// A hedgeSchedule says which arrivals pause: pauses returns a fresh
// decision per run, so every peer sees the same sequence.
type hedgeSchedule struct {
	name   string
	pauses func() func(*http.Request) bool
}

// byArrival pauses the arrivals for which script says Delay.
func byArrival(script func() *resiliencetest.Script) func() func(*http.Request) bool {
	return func() func(*http.Request) bool {
		s := script()
		return func(*http.Request) bool { return s.Next().Delay > 0 }
	}
}

var hedgeSchedules = []hedgeSchedule{
	{"every5th", byArrival(func() *resiliencetest.Script {
		return resiliencetest.Func(func(n int) resiliencetest.Fault {
			if n%5 == 4 {
				return resiliencetest.Fault{Delay: hedgePause}
			}
			return resiliencetest.Fault{}
		})
	})},
	{"mix", byArrival(func() *resiliencetest.Script {
		return resiliencetest.Mix(hedgeSeed,
			resiliencetest.Weighted{Weight: 80},
			resiliencetest.Weighted{Weight: 20, Fault: resiliencetest.Fault{Delay: hedgePause}},
		)
	})},
	{"first", func() func(*http.Request) bool {
		var seen sync.Map
		return func(r *http.Request) bool {
			k, err := strconv.Atoi(r.URL.Query().Get("k"))
			if err != nil || k%5 != 4 {
				return false
			}
			_, again := seen.LoadOrStore(k, true)
			return !again
		}
	}},
}

// A hedgePeer builds the handler under test; onEvent sees its events.
type hedgePeer struct {
	name string
	new  func(base http.RoundTripper, onEvent func(resilience.Event)) (*resilience.Transport, error)
}

var hedgePeers = []hedgePeer{
	// standard: the standard handler, defaults.
	{"standard", func(base http.RoundTripper, onEvent func(resilience.Event)) (*resilience.Transport, error) {
		return resilience.NewTransport(base, resilience.Options{OnEvent: onEvent})
	}},
	// hedging: the standard hedging handler (retry budget on), one hedge
	// after 300 ms. (It had PerHost on until endpoints stopped needing it;
	// with one upstream host, per-host state is the handler's.)
	{"hedging", func(base http.RoundTripper, onEvent func(resilience.Event)) (*resilience.Transport, error) {
		return resilience.NewTransport(base, resilience.Options{
			// No cap on extra load (issue 10's default is 5 %): this
			// experiment measures hedging itself, at 20 % slow calls.
			Hedging: resilience.HedgingOptions{Enabled: true, MaxHedges: 1, Delay: hedgeDelay, MaxExtraLoad: resilience.NoExtraLoadCap},
			OnEvent: onEvent,
		})
	}},
	// hedging-nobudget: the same without the retry budget, to tell what
	// the budget's refusals cost from what hedges that pause too cost.
	{"hedging-nobudget", func(base http.RoundTripper, onEvent func(resilience.Event)) (*resilience.Transport, error) {
		return resilience.NewTransport(base, resilience.Options{
			Hedging:     resilience.HedgingOptions{Enabled: true, MaxHedges: 1, Delay: hedgeDelay, MaxExtraLoad: resilience.NoExtraLoadCap},
			RetryBudget: resilience.RetryBudgetOptions{Disabled: true},
			OnEvent:     onEvent,
		})
	}},
}

// pausingUpstream answers "ok" at once, or after hedgePause when pause
// says so; a paused request whose client goes away ends at once and is
// counted.
type pausingUpstream struct {
	srv       *httptest.Server
	pause     func(*http.Request) bool
	requests  atomic.Int64
	paused    atomic.Int64
	cancelled atomic.Int64
	active    atomic.Int64
	conns     atomic.Int64
}

func newPausingUpstream(pause func(*http.Request) bool) *pausingUpstream {
	u := &pausingUpstream{pause: pause}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.srv.Start()
	return u
}

func (u *pausingUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.active.Add(1)
	defer u.active.Add(-1)
	u.requests.Add(1)
	if u.pause(r) {
		u.paused.Add(1)
		t := time.NewTimer(hedgePause)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			u.cancelled.Add(1)
			return
		}
	}
	_, _ = w.Write([]byte("ok"))
}

// hedgeResult is what one peer's run measured.
type hedgeResult struct {
	p50, p90, p95, p99, max time.Duration // Do to body closed
	failed                  int           // calls without a 200 read in full
	attempts                int           // requests the upstream received
	paused, cancelled       int           // of those: paused; paused and cancelled by the client
	conns                   int           // TCP connections the upstream accepted
	hedges, refused         int64         // EventHedge, EventBudgetExceeded
	goroutines              int           // left after the run, over the baseline
	wall                    time.Duration
}

func runHedging(tb testing.TB, sched hedgeSchedule, p hedgePeer) hedgeResult {
	up := newPausingUpstream(sched.pauses())
	defer up.srv.Close()
	before := settledGoroutines(-1)

	base := loopbackTransport()
	var hedges, refused atomic.Int64
	t, err := p.new(base, func(e resilience.Event) {
		switch e.Kind {
		case resilience.EventHedge:
			hedges.Add(1)
		case resilience.EventBudgetExceeded:
			refused.Add(1)
		}
	})
	if err != nil {
		tb.Fatalf("%s: %v", p.name, err)
	}
	c := &http.Client{Transport: t}
	var res hedgeResult
	start := time.Now()
	latency, failed := closedLoop(c, hedgeRequests, hedgeConcurrency, up.srv.URL+"/search")
	res.failed += failed
	res.wall = time.Since(start)
	// Losers are cancelled and drained in the background: give the
	// upstream's handlers up to 2 s to see them go before counting.
	for deadline := time.Now().Add(2 * time.Second); up.active.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	c.CloseIdleConnections()
	res.goroutines = settledGoroutines(before) - before
	res.attempts = int(up.requests.Load())
	res.paused = int(up.paused.Load())
	res.cancelled = int(up.cancelled.Load())
	res.conns = int(up.conns.Load())
	res.hedges, res.refused = hedges.Load(), refused.Load()
	slices.Sort(latency)
	pct := func(p int) time.Duration { return latency[len(latency)*p/100] }
	res.p50, res.p90, res.p95, res.p99 = pct(50), pct(90), pct(95), pct(99)
	res.max = latency[len(latency)-1]
	return res
}

// BenchmarkHedging runs the hedging experiment once per schedule and peer,
// whatever b.N (run it with -benchtime 1x), and reports latency
// percentiles (ms), upstream attempts per request, hedges sent, hedges the
// retry budget refused, losing attempts (attempts beyond one per request)
// and how many of them the upstream saw cancelled, connections, and
// goroutines left after CloseIdleConnections; ns/op is the wall time of
// the run. About 75 s in all, most of it the peers without hedging.
func BenchmarkHedging(b *testing.B) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, s := range hedgeSchedules {
		for _, p := range hedgePeers {
			b.Run("pause="+s.name+"/peer="+p.name, func(b *testing.B) {
				r := runHedging(b, s, p)
				b.ReportMetric(float64(r.wall.Nanoseconds())/float64(b.N), "ns/op")
				b.ReportMetric(ms(r.p50), "p50-ms")
				b.ReportMetric(ms(r.p90), "p90-ms")
				b.ReportMetric(ms(r.p95), "p95-ms")
				b.ReportMetric(ms(r.p99), "p99-ms")
				b.ReportMetric(ms(r.max), "max-ms")
				b.ReportMetric(float64(r.attempts)/hedgeRequests, "attempts/req")
				b.ReportMetric(float64(r.hedges), "hedges")
				b.ReportMetric(float64(r.refused), "budget-refused")
				b.ReportMetric(float64(r.attempts-hedgeRequests), "losers")
				b.ReportMetric(float64(r.cancelled), "cancelled")
				b.ReportMetric(float64(r.paused), "paused")
				b.ReportMetric(float64(r.conns), "new-conns")
				b.ReportMetric(float64(r.goroutines), "goroutines-left")
				b.ReportMetric(float64(r.failed), "failed")
			})
		}
	}
}
