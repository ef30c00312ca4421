package bench

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// The Retry-After experiment for hedging (issue 29, item 5): an HTTP/1.1
// upstream that answers 503 with Retry-After: 1 while it is unavailable,
// called by raRuns calls sent open loop, one every raInterval, through
//
//   - bare: net/http alone;
//   - retry: the standard handler (3 retries, a Retry-After honoured);
//   - hedge: the standard hedging handler (Hedging.Enabled, its defaults:
//     one hedge, Delay 2 s);
//   - hedge3: the same with MaxHedges 3, as many attempts as retry.
//
// Two schedules of unavailability, the same for every peer (seeded, and
// timed from the start of each peer's run):
//
//   - outages: in each 2 s period, a 600 ms outage at a seeded offset (30 %
//     of the time): every request inside it gets the 503;
//   - share: a seeded 20 % of requests get the 503, independently of time.
//
// Under the first, Retry-After tells the truth (the server stays down a
// while): a hedge sent at once lands in the same outage, one that waits the
// second does not. Under the second it does not: a request sent at once
// fails no more often than one sent a second later.
const (
	raCalls    = 400
	raInterval = 25 * time.Millisecond
	raPeriod   = 2 * time.Second
	raOutage   = 600 * time.Millisecond
	raShare    = 0.2
	raSeed     = 29
)

type raUpstream struct {
	srv      *httptest.Server
	down     func(at time.Duration) bool // the outages schedule, or nil
	share    func() bool                 // the share schedule, or nil
	start    time.Time
	requests atomic.Int64
	refused  atomic.Int64
}

func newRAUpstream(schedule string) *raUpstream {
	u := &raUpstream{start: time.Now()} // the schedules' time 0, and the first call's
	switch schedule {
	case "outages":
		r := rand.New(rand.NewPCG(raSeed, raSeed))
		var offsets []time.Duration
		for range 64 {
			offsets = append(offsets, time.Duration(r.Int64N(int64(raPeriod-raOutage))))
		}
		u.down = func(at time.Duration) bool {
			k := int(at / raPeriod)
			if k >= len(offsets) {
				return false
			}
			in := at - time.Duration(k)*raPeriod
			return in >= offsets[k] && in < offsets[k]+raOutage
		}
	case "share":
		var mu sync.Mutex
		r := rand.New(rand.NewPCG(raSeed, raSeed))
		u.share = func() bool {
			mu.Lock()
			defer mu.Unlock()
			return r.Float64() < raShare
		}
	}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		if (u.down != nil && u.down(time.Since(u.start))) || (u.share != nil && u.share()) {
			u.refused.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	return u
}

var raPeers = []struct {
	name string
	opts *resilience.Options // nil: bare
}{
	{"bare", nil},
	{"retry", &resilience.Options{}},
	{"hedge", &resilience.Options{Hedging: resilience.HedgingOptions{Enabled: true}}},
	{"hedge3", &resilience.Options{Hedging: resilience.HedgingOptions{Enabled: true, MaxHedges: 3}}},
}

type raResult struct {
	schedule, peer string
	ok             int
	attempts       float64 // per call
	p50, p99       time.Duration
	// events: retries, hedges, budget refusals, circuit openings and
	// rejections, hedges over MaxExtraLoad
	retries, hedges, refused, opened, rejected, capped int64
}

func runRA(tb testing.TB, schedule string, peer int) raResult {
	u := newRAUpstream(schedule)
	defer u.srv.Close()
	base := loopbackTransport()
	var rt http.RoundTripper = base
	var events [resilience.EventPushback + 1]atomic.Int64
	if o := raPeers[peer].opts; o != nil {
		opts := *o
		opts.OnEvent = func(e resilience.Event) {
			if int(e.Kind) < len(events) {
				events[e.Kind].Add(1)
			}
		}
		t, err := resilience.NewTransport(base, opts)
		if err != nil {
			tb.Fatal(err)
		}
		rt = t
	}
	c := &http.Client{Transport: rt}
	defer base.CloseIdleConnections()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		lat []time.Duration
		ok  int
	)
	for k := range raCalls {
		time.Sleep(time.Until(u.start.Add(time.Duration(k) * raInterval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest(http.MethodGet, u.srv.URL+"/item", nil)
			if err != nil {
				panic(err)
			}
			t0 := time.Now()
			err = do(c, req)
			d := time.Since(t0)
			mu.Lock()
			lat = append(lat, d)
			if err == nil {
				ok++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return raResult{
		schedule: schedule, peer: raPeers[peer].name, ok: ok,
		attempts: float64(u.requests.Load()) / raCalls,
		p50:      quantile(lat, 0.5), p99: quantile(lat, 0.99),
		retries: events[resilience.EventRetry].Load(), hedges: events[resilience.EventHedge].Load(),
		refused: events[resilience.EventBudgetExceeded].Load(), opened: events[resilience.EventCircuitOpened].Load(),
		rejected: events[resilience.EventCircuitRejected].Load(), capped: events[resilience.EventHedgeCapped].Load(),
	}
}

// BenchmarkHedgeRetryAfter runs the experiment once, whatever b.N (run it
// with -benchtime 1x; about 90 s), and with BENCH_RESULTS set writes the
// table there (as RA_NAME, default hedge-retryafter.md).
func BenchmarkHedgeRetryAfter(b *testing.B) {
	var s strings.Builder
	fmt.Fprintf(&s, "%d GETs, one every %v (open loop), against an HTTP/1.1 upstream answering 503 with Retry-After: 1 while unavailable.\n"+
		"outages: a %v outage at a seeded offset in each %v period; share: a seeded %.0f%% of requests.\n\n",
		raCalls, raInterval, raOutage, raPeriod, 100*raShare)
	s.WriteString("| schedule | peer | success % | attempts/call | p50 ms | p99 ms | retries | hedges | budget refused | circuit opened | circuit rejected | hedge capped |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, schedule := range []string{"outages", "share"} {
		for i := range raPeers {
			b.Run("schedule="+schedule+"/peer="+raPeers[i].name, func(b *testing.B) {
				r := runRA(b, schedule, i)
				pct := 100 * float64(r.ok) / raCalls
				b.ReportMetric(pct, "success-%")
				b.ReportMetric(r.attempts, "attempts/call")
				fmt.Fprintf(&s, "| %s | %s | %.1f | %.3f | %.1f | %.1f | %d | %d | %d | %d | %d | %d |\n", r.schedule, r.peer, pct, r.attempts,
					float64(r.p50.Microseconds())/1000, float64(r.p99.Microseconds())/1000,
					r.retries, r.hedges, r.refused, r.opened, r.rejected, r.capped)
			})
		}
	}
	b.Log("\n" + s.String())
	if dir := os.Getenv("BENCH_RESULTS"); dir != "" {
		name := os.Getenv("RA_NAME")
		if name == "" {
			name = "hedge-retryafter.md"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
