package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience"
)

// The attempt-timeout experiment (issue 47): the cases in which an attempt
// past AttemptTimeout must be cut and retried (a hung request, a hung
// endpoint, a black hole, a dead pooled connection, an endless 1xx), and
// the two it must keep serving (a slow-but-working upstream, one request
// in 50 hanging). Each case runs three clients side by side, each on its
// own identical loopback upstream (httptest):
//
//   - defaults: the standard handler with time scaled as issue 47 scales
//     it (atOptions: AttemptTimeout 200ms, TotalTimeout 2s, Retry.Delay
//     20ms, CircuitBreaker.SamplingDuration 3s; every other field zero);
//   - strict: the same with StrictAttemptTimeout, Polly's rule;
//   - bare: http.Client{Timeout: 2s} over the same base transport.
//
// A case's own options (1a's AttemptTimeout 100ms, case 4's TotalTimeout
// off, case 5's hedging) apply to defaults and strict; bare is always the
// same. Attempts are counted where they arrive, at the upstream. Nothing
// here is asserted on time: TestAttemptTimeoutSmoke checks the harness.
//
// One run, about 4 minutes on 2 cores; ATTEMPT_OUT=name writes the tables
// to results/name.md, ATTEMPT_DURATION (a time.Duration) replaces the
// length of every open-loop case (2-rate 10s, 3-blackhole 8s, K2 5s):
//
//	ATTEMPT_OUT=attempttimeout go test -run '^$' -bench '^BenchmarkAttemptTimeout$' -benchtime 1x -timeout 30m .
func BenchmarkAttemptTimeout(b *testing.B) {
	p := atBenchParams()
	if s := os.Getenv("ATTEMPT_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.Fatalf("ATTEMPT_DURATION=%q: want a positive duration such as 10s", s)
		}
		p.rateFor, p.blackholeFor, p.k2For = d, d, d
	}
	start, loadBefore := time.Now(), ovlLoadAvg()
	var tables []string
	for _, c := range atCases {
		b.Run("case="+c.name, func(b *testing.B) {
			r := runAttemptCase(b, c, p)
			for _, row := range r.rows {
				b.ReportMetric(row.served(), "served%-"+row.client)
				b.ReportMetric(ms(row.quantile(0.5)), "p50-ms-"+row.client)
				b.ReportMetric(row.attemptsPerCall(), "attempts/call-"+row.client)
			}
			tables = append(tables, r.table(c))
		})
		if len(tables) > 0 && strings.Contains(tables[len(tables)-1], "`case="+c.name+"`") {
			fmt.Print("\n" + tables[len(tables)-1] + "\n")
		}
	}
	if len(tables) == 0 {
		return
	}
	body := strings.Join(tables, "\n")
	if name := os.Getenv("ATTEMPT_OUT"); name != "" {
		header := atHeader(time.Since(start), loadBefore, ovlLoadAvg())
		if err := os.WriteFile(filepath.Join("results", name+".md"), []byte(header+body), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAttemptTimeoutSmoke runs every case briefly, the cases at once,
// and checks the harness only: every call ends one way, the outcomes add
// up to the calls, the upstream saw attempts, and no handler sent more
// than its retries (or hedges) allow. It asserts nothing about which
// client does better, nor about time.
func TestAttemptTimeoutSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of hung calls")
	}
	p := atParams{
		seqCalls: 1, freshCalls: 1, postCalls: 1,
		rateFor: 300 * time.Millisecond, blackholeFor: 200 * time.Millisecond, k2For: 300 * time.Millisecond,
		callerLimit: time.Second, hedgeCalls: 1,
		poolCalls: 7, poolEvery: 20 * time.Millisecond, // the 6th request meets the silent connection
		rrCalls: 4, rrEvery: 10 * time.Millisecond, // the first goes to the hung backend
		hintsCalls: 1, k1Calls: 1, failoverCalls: 1,
	}
	// The cases at once, in goroutines of their own: t.Parallel would run
	// GOMAXPROCS of them at a time, and they mostly wait.
	results := make([]atCaseResult, len(atCases))
	var wg sync.WaitGroup
	for i, c := range atCases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runAttemptCase(t, c, p)
		}()
	}
	wg.Wait()
	for i, c := range atCases {
		r := results[i]
		t.Run(c.name, func(t *testing.T) {
			t.Log("\n" + r.table(c))
			require.Len(t, r.rows, len(atClientNames))
			for _, row := range r.rows {
				want := c.calls(p)
				assert.Len(t, row.calls, want, "%s: every call made", row.client)
				n, ok := 0, 0
				for _, o := range row.outcomes() {
					n += o.n
					if o.class == "ok" {
						ok = o.n
					}
				}
				assert.Equal(t, want, n, "%s: the outcomes add up to the calls", row.client)
				served := 0
				for _, cl := range row.calls {
					if cl.ok {
						served++
					}
					assert.Positive(t, cl.lat, "%s: a call takes time", row.client)
				}
				assert.Equal(t, ok, served, "%s: ok outcomes are the calls served", row.client)
				assert.Positive(t, row.attempts, "%s: the upstream saw attempts", row.client)
				perCall := int64(4) // the first attempt and 3 retries
				if c.name == "5-hedging" {
					perCall = 3 // the first attempt and 2 hedges
				}
				assert.LessOrEqual(t, row.attempts, perCall*int64(want), "%s: at most %d attempts per call", row.client, perCall)
				if row.client == "bare" {
					assert.Nil(t, row.ev, "bare has no events")
				} else {
					require.NotNil(t, row.ev)
					assert.GreaterOrEqual(t, row.ev.opened, len(row.ev.openedOn), "%s: openings counted per endpoint", row.client)
				}
			}
		})
	}
}

// The scaled durations of issue 47 (the faults experiment's: the
// defaults' AttemptTimeout ÷ 50, TotalTimeout ÷ 15, Retry.Delay ÷ 100,
// SamplingDuration ÷ 10), and bare's timeout.
var (
	atAttempt = shipped().AttemptTimeout / 50
	atTotal   = shipped().TotalTimeout / 15
)

// atOptions are the standard handler's defaults scaled as issue 47 says:
// AttemptTimeout, TotalTimeout, Retry.Delay and SamplingDuration, derived
// from the defaults in force (shipped) so that a changed default follows
// here; every other field is zero, the library's default. It differs from
// dnhOptions, which also scales Retry.MaxDelay, BreakDuration and
// Overload.MaxQueueWait: the figures were measured without.
func atOptions() resilience.Options {
	d := shipped()
	return resilience.Options{
		TotalTimeout:   atTotal,
		AttemptTimeout: atAttempt,
		Retry:          resilience.RetryOptions{Delay: d.Retry.Delay / 100},
		CircuitBreaker: resilience.CircuitBreakerOptions{
			SamplingDuration: max(d.CircuitBreaker.SamplingDuration/10, 2*atAttempt),
		},
	}
}

// atClientNames are the columns' clients, in the tables' order.
var atClientNames = []string{"defaults", "strict", "bare"}

// atParams sizes the cases: atBenchParams for the benchmark, smaller in
// the smoke test.
type atParams struct {
	seqCalls      int           // 1a: sequential calls
	freshCalls    int           // 1a-fresh: calls, each on a new client
	postCalls     int           // 1b: sequential POSTs
	rateFor       time.Duration // 2-rate: 50 calls/s for this long
	blackholeFor  time.Duration // 3: 200 calls/s for this long
	k2For         time.Duration // K2: 20 calls/s for this long
	callerLimit   time.Duration // 4: the caller's context
	hedgeCalls    int           // 5: sequential calls
	poolCalls     int           // 6a: calls, one every poolEvery
	poolEvery     time.Duration
	rrCalls       int // 6b: calls, one every rrEvery
	rrEvery       time.Duration
	hintsCalls    int           // 7: sequential calls
	k1Calls       int           // K1: sequential calls
	failoverCalls int           // 2-seq: sequential calls
	isolate       bool          // 3: the clients one after another, so that each one's goroutines are its own
	settle        time.Duration // after a case, how long its goroutines may take to end before they are counted
}

func atBenchParams() atParams {
	return atParams{
		seqCalls: 10, freshCalls: 5, postCalls: 3,
		rateFor: 10 * time.Second, blackholeFor: 8 * time.Second, k2For: 5 * time.Second,
		callerLimit: 10 * time.Second, hedgeCalls: 2,
		poolCalls: 20, poolEvery: 500 * time.Millisecond,
		rrCalls: 40, rrEvery: 100 * time.Millisecond,
		hintsCalls: 3, k1Calls: 20, failoverCalls: 20,
		isolate: true, settle: 2 * time.Second,
	}
}

// Open-loop rates, calls per second.
const (
	atRate2  = 50
	atRate3  = 200
	atRateK2 = 20
)

// atSafety bounds every call that has no caller context of its own in the
// case: nothing here waits longer.
const atSafety = 10 * time.Second

// An atCase is one of issue 47's cases: run is one client's run of it,
// against an upstream of its own, everything stopped when it returns.
type atCase struct {
	name, title, what string
	calls             func(atParams) int // how many calls a client makes
	run               func(tb testing.TB, p atParams, client string) atRun
	isolated          bool // clients one after another when atParams.isolate
}

var atCases = []atCase{
	{
		name: "1a-hung-get", title: "1a. A lone hung GET",
		what: "Each call's first request hangs (the upstream keys requests by the call's number in the query), its retries answer 200 at once; " +
			"one client, sequential calls. AttemptTimeout 100ms for defaults and strict.",
		calls: func(p atParams) int { return p.seqCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atFirstHangs())
			defer up.close()
			c := newAtClient(tb, client, func(o *resilience.Options) { o.AttemptTimeout = 100 * time.Millisecond })
			defer c.close()
			calls := atSequential(p.seqCalls, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
		},
	},
	{
		name: "1a-fresh", title: "1a. A lone hung GET, each call on a fresh client",
		what: "As 1a, but each call on a new client (a new Handler and base transport): the handler has never had an answer. " +
			"AttemptTimeout 100ms for defaults and strict; circuit openings summed over the clients.",
		calls: func(p atParams) int { return p.freshCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atFirstHangs())
			defer up.close()
			var ev *atEvents
			if client != "bare" {
				ev = newAtEvents()
			}
			calls := atSequential(p.freshCalls, 0, func(k int) atCall {
				c := newAtClient(tb, client, func(o *resilience.Options) { o.AttemptTimeout = 100 * time.Millisecond })
				defer c.close()
				cl := atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
				ev.add(c.ev)
				return cl
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: ev}
		},
	},
	{
		name: "1b-hung-post", title: "1b. A POST that hangs",
		what:  "Every request hangs; sequential POSTs with a small body (never retried: the method rule).",
		calls: func(p atParams) int { return p.postCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atHangs)
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			calls := atSequential(p.postCalls, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodPost, up.URL+"/orders?k="+strconv.Itoa(k), atSafety)
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
		},
	},
	{
		name: "2-failover-seq", title: "2. Failover from a hung endpoint, sequential",
		what: "Endpoints [A: accepts and never answers, B: answers 200 at once], RouteOrdered; sequential GETs. " +
			"Bare has no endpoints: it calls A, the first URL it would be configured with.",
		calls: func(p atParams) int { return p.failoverCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			return atFailover(tb, client, func(c *http.Client, url string) []atCall {
				return atSequential(p.failoverCalls, 0, func(k int) atCall {
					return atDo(c, http.MethodGet, url+"?k="+strconv.Itoa(k), atSafety)
				})
			})
		},
	},
	{
		name: "2-failover-rate", title: "2. Failover from a hung endpoint, 50 calls/s",
		what:  fmt.Sprintf("As 2-failover-seq, open loop at %d calls/s (call k starts at k/%d s, whatever the others do).", atRate2, atRate2),
		calls: func(p atParams) int { return atOpenCalls(atRate2, p.rateFor) },
		run: func(tb testing.TB, p atParams, client string) atRun {
			return atFailover(tb, client, func(c *http.Client, url string) []atCall {
				return atOpenLoop(atRate2, p.rateFor, func(k int) atCall {
					return atDo(c, http.MethodGet, url+"?k="+strconv.Itoa(k), atSafety)
				})
			})
		},
	},
	{
		name: "3-blackhole", title: "3. A black hole from the start",
		what: fmt.Sprintf("The upstream accepts every connection and never answers, from the first request; open loop at %d calls/s. "+
			"Peak goroutines: the process's, sampled every 5ms (in the benchmark the clients run one after another, so each is its own). "+
			"Refused by the circuit: calls that ended on ErrCircuitOpen.", atRate3),
		calls:    func(p atParams) int { return atOpenCalls(atRate3, p.blackholeFor) },
		isolated: true,
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atHangs)
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			peak := atPeakGoroutines()
			c.ev.begin()
			calls := atOpenLoop(atRate3, p.blackholeFor, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			r := atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev, peak: peak()}
			refused := 0
			for _, cl := range calls {
				if cl.class == "circuit_open" {
					refused++
				}
			}
			r.notes = append(r.notes, fmt.Sprintf("refused by the circuit %d", refused), fmt.Sprintf("attempts %d", r.attempts),
				fmt.Sprintf("peak goroutines %d", r.peak))
			if r.ev != nil {
				r.notes = append(r.notes, "first opened "+r.ev.firstOpenedString())
			}
			return r
		},
	},
	{
		name: "4-no-total", title: "4. TotalTimeout off",
		what: "TotalTimeout -1 and AttemptTimeout 200ms for defaults and strict; each call's first request hangs, its retries answer 200 at once; " +
			"each call has a caller context of 10s (the smoke test: 1s). Bare keeps its Timeout of 2s.",
		calls: func(p atParams) int { return 1 },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atFirstHangs())
			defer up.close()
			c := newAtClient(tb, client, func(o *resilience.Options) { o.TotalTimeout = -1 })
			defer c.close()
			calls := atSequential(1, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), p.callerLimit)
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
		},
	},
	{
		name: "5-hedging", title: "5. Hedging on attempt timeouts",
		what: "Hedging{Enabled, Delay: 5s, MaxHedges: 2}, AttemptTimeout 50ms, TotalTimeout 3s (to keep the run bounded) for defaults and strict; " +
			"the upstream never answers; sequential GETs. Bare keeps its Timeout of 2s.",
		calls: func(p atParams) int { return p.hedgeCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, atHangs)
			defer up.close()
			c := newAtClient(tb, client, func(o *resilience.Options) {
				o.Hedging = resilience.HedgingOptions{Enabled: true, Delay: 5 * time.Second, MaxHedges: 2}
				o.AttemptTimeout = 50 * time.Millisecond
				o.TotalTimeout = 3 * time.Second
			})
			defer c.close()
			calls := atSequential(p.hedgeCalls, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			r := atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
			if r.ev != nil {
				r.notes = append(r.notes, fmt.Sprintf("hedges %d, capped %d", r.ev.count(resilience.EventHedge), r.ev.count(resilience.EventHedgeCapped)))
			}
			return r
		},
	},
	{
		name: "6a-dead-conn", title: "6a. A dead pooled connection",
		what: "HTTP/1.1 keep-alive; each connection answers 5 requests at once, then goes silent: the server hijacks it at its 6th request " +
			"and never writes to it again (a new connection answers). A sequential caller, one call every 500ms (the smoke test: 20ms; " +
			"a call that ends late is followed at once). Calls hit: those with a request the server silenced; their latency.",
		calls: func(p atParams) int { return p.poolCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			var silenced sync.Map // call number -> true
			up := newAtUpstream(tb, func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
				if r.Context().Value(atConnKey{}).(*atomic.Int64).Add(1) > 5 {
					silenced.Store(r.URL.Query().Get("k"), true)
					u.silence(w)
					return
				}
				_, _ = w.Write([]byte("ok"))
			})
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			calls := atSequential(p.poolCalls, p.poolEvery, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			r := atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
			var hit []string
			for k, cl := range calls {
				if _, ok := silenced.Load(strconv.Itoa(k)); ok {
					hit = append(hit, fmt.Sprintf("%.0f", ms(cl.lat)))
				}
			}
			r.notes = append(r.notes, fmt.Sprintf("calls hit %d (ms: %s)", len(hit), strings.Join(hit, ", ")),
				fmt.Sprintf("connections %d", up.conns.Load()))
			return r
		},
	},
	{
		name: "6b-round-robin", title: "6b. One of four round-robin backends hung",
		what: "Four upstreams, the first accepts and never answers; the client has one plain URL and its base transport sends each request " +
			"(each attempt) to the next backend in turn, as a client-side balancer, DNS round robin or a sidecar does (not Endpoints). " +
			"A sequential caller, one call every 100ms (the smoke test: 10ms; a call that ends late is followed at once).",
		calls: func(p atParams) int { return p.rrCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			ups := make([]*atUpstream, 4)
			hosts := make([]string, 4)
			for i := range ups {
				h := atAnswers
				if i == 0 {
					h = atHangs
				}
				ups[i] = newAtUpstream(tb, h)
				defer ups[i].close()
				hosts[i] = strings.TrimPrefix(ups[i].URL, "http://")
			}
			c := newAtClientOver(tb, client, &atRoundRobin{hosts: hosts}, nil)
			defer c.close()
			calls := atSequential(p.rrCalls, p.rrEvery, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, "http://backends.invalid/items?k="+strconv.Itoa(k), atSafety)
			})
			r := atRun{calls: calls, ev: c.ev}
			per := make([]string, len(ups))
			for i, u := range ups {
				n := u.requests.Load()
				r.attempts += n
				per[i] = strconv.FormatInt(n, 10)
			}
			r.notes = append(r.notes, "requests per backend (hung first) "+strings.Join(per, "/"))
			return r
		},
	},
	{
		name: "7-early-hints", title: "7. Endless 1xx",
		what:  "The upstream answers every request with `103 Early Hints` every 2ms for ever (a hijacked connection, raw bytes), never a final status; sequential GETs.",
		calls: func(p atParams) int { return p.hintsCalls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			var hints atomic.Int64
			up := newAtUpstream(tb, func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
				u.earlyHints(w, &hints)
			})
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			calls := atSequential(p.hintsCalls, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			r := atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
			r.notes = append(r.notes, fmt.Sprintf("103s written %d", hints.Load()))
			return r
		},
	},
	{
		name: "K1-slow", title: "K1 (keep). A slow-but-working upstream",
		what: fmt.Sprintf("Every answer after %v (1.5 × AttemptTimeout), each request on its own timer: no queue; sequential GETs. "+
			"Defaults should serve it as bare does, strict cuts every attempt.", atAttempt*3/2),
		calls: func(p atParams) int { return p.k1Calls },
		run: func(tb testing.TB, p atParams, client string) atRun {
			up := newAtUpstream(tb, func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
				t := time.NewTimer(atAttempt * 3 / 2)
				defer t.Stop()
				select {
				case <-t.C:
					_, _ = w.Write([]byte("ok"))
				case <-r.Context().Done():
				case <-u.stop:
				}
			})
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			calls := atSequential(p.k1Calls, 0, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
		},
	},
	{
		name: "K2-one-in-50", title: "K2 (keep). One request in 50 hanging",
		what:  fmt.Sprintf("Every 50th request the upstream receives hangs (the 50th, 100th, …), the others answer 200 at once; open loop at %d calls/s.", atRateK2),
		calls: func(p atParams) int { return atOpenCalls(atRateK2, p.k2For) },
		run: func(tb testing.TB, p atParams, client string) atRun {
			var n atomic.Int64
			up := newAtUpstream(tb, func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
				if n.Add(1)%50 == 0 {
					atHangs(u, w, r)
					return
				}
				_, _ = w.Write([]byte("ok"))
			})
			defer up.close()
			c := newAtClient(tb, client, nil)
			defer c.close()
			calls := atOpenLoop(atRateK2, p.k2For, func(k int) atCall {
				return atDo(c.Client, http.MethodGet, up.URL+"/items?k="+strconv.Itoa(k), atSafety)
			})
			return atRun{calls: calls, attempts: up.requests.Load(), ev: c.ev}
		},
	},
}

// atFailover is one client's run of case 2: Endpoints [A hung, B healthy],
// calls made by calls with the client and the URL to call.
func atFailover(tb testing.TB, client string, calls func(c *http.Client, url string) []atCall) atRun {
	a := newAtUpstream(tb, atHangs)
	defer a.close()
	bsrv := newAtUpstream(tb, atAnswers)
	defer bsrv.close()
	c := newAtClient(tb, client, func(o *resilience.Options) {
		o.Endpoints = []resilience.Endpoint{{URL: a.URL}, {URL: bsrv.URL}}
		o.Routing = resilience.RouteOrdered
	})
	defer c.close()
	url := "http://orders.invalid/items"
	if client == "bare" {
		url = a.URL + "/items"
	}
	r := atRun{calls: calls(c.Client, url), ev: c.ev}
	r.attempts = a.requests.Load() + bsrv.requests.Load()
	r.notes = append(r.notes, fmt.Sprintf("requests A %d, B %d", a.requests.Load(), bsrv.requests.Load()))
	if r.ev != nil {
		r.ev.mu.Lock()
		openedA, openedB := r.ev.openedOn[a.URL], r.ev.openedOn[bsrv.URL]
		r.ev.mu.Unlock()
		r.notes = append(r.notes, fmt.Sprintf("A's circuit opened %d×, B's %d×", openedA, openedB))
	}
	return r
}

// atOpenCalls is how many calls an open loop at rate makes in d.
func atOpenCalls(rate float64, d time.Duration) int { return max(1, int(rate*d.Seconds())) }

// atCaseResult is a case's rows, one per client, and the process's
// goroutines before the case and after it (everything stopped, settled).
type atCaseResult struct {
	rows          []atRun
	before, after int
}

// runAttemptCase runs c with each client, side by side, or one after
// another if c is isolated and p says so.
func runAttemptCase(tb testing.TB, c atCase, p atParams) atCaseResult {
	tb.Helper()
	res := atCaseResult{rows: make([]atRun, len(atClientNames)), before: runtime.NumGoroutine()}
	if c.isolated && p.isolate {
		for i, name := range atClientNames {
			res.rows[i] = c.run(tb, p, name)
			res.rows[i].client = name
		}
	} else {
		var wg sync.WaitGroup
		for i, name := range atClientNames {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res.rows[i] = c.run(tb, p, name)
				res.rows[i].client = name
			}()
		}
		wg.Wait()
	}
	// Goroutines left: what has not ended p.settle after everything stopped.
	for deadline := time.Now().Add(p.settle); ; time.Sleep(10 * time.Millisecond) {
		res.after = runtime.NumGoroutine()
		if res.after <= res.before || time.Now().After(deadline) {
			break
		}
	}
	return res
}

// An atRun is one client's run of a case.
type atRun struct {
	client   string
	calls    []atCall  // in the order made
	attempts int64     // requests that reached the upstream(s)
	ev       *atEvents // nil for bare
	peak     int       // peak goroutines, where sampled
	notes    []string  // the case's own figures
}

// An atCall is one call's outcome.
type atCall struct {
	lat   time.Duration // from the request to the body read
	ok    bool          // a 200 with its body read
	class string        // "ok", or the failure's class (atClass)
	err   string        // the error's text, if any
}

func (r atRun) served() float64 {
	if len(r.calls) == 0 {
		return 0
	}
	n := 0
	for _, c := range r.calls {
		if c.ok {
			n++
		}
	}
	return 100 * float64(n) / float64(len(r.calls))
}

func (r atRun) quantile(q float64) time.Duration {
	if len(r.calls) == 0 {
		return 0
	}
	lat := make([]time.Duration, len(r.calls))
	for i, c := range r.calls {
		lat[i] = c.lat
	}
	slices.Sort(lat)
	return quantile(lat, q)
}

func (r atRun) attemptsPerCall() float64 {
	if len(r.calls) == 0 {
		return 0
	}
	return float64(r.attempts) / float64(len(r.calls))
}

type atOutcome struct {
	class string
	n     int
	err   string // the first error of the class
}

// outcomes counts the calls by class, the most frequent first.
func (r atRun) outcomes() []atOutcome {
	var out []atOutcome
	for _, c := range r.calls {
		i := slices.IndexFunc(out, func(o atOutcome) bool { return o.class == c.class })
		if i < 0 {
			out = append(out, atOutcome{class: c.class, err: c.err})
			i = len(out) - 1
		}
		out[i].n++
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].n > out[j].n })
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// table is the case's markdown: what it is, a row per client, the first
// error of each class, and the goroutines left.
func (res atCaseResult) table(c atCase) string {
	var s strings.Builder
	fmt.Fprintf(&s, "### %s (`case=%s`)\n\n%s\n\n", c.title, c.name, c.what)
	s.WriteString("| client | calls | served % | p50 ms | p99 ms | max ms | attempts/call | outcomes | circuit opened | held | budget refused | notes |\n")
	s.WriteString("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
	var errs []string
	for _, r := range res.rows {
		var outs []string
		for _, o := range r.outcomes() {
			outs = append(outs, fmt.Sprintf("%s %d", o.class, o.n))
			if o.err != "" {
				errs = append(errs, fmt.Sprintf("%s, %s: `%s`", r.client, o.class, atTrim(o.err, 160)))
			}
		}
		opened, held, refused := "–", "–", "–"
		if r.ev != nil {
			opened = strconv.Itoa(r.ev.opened)
			held = strconv.Itoa(r.ev.count(resilience.EventAttemptHeld))
			refused = strconv.Itoa(r.ev.count(resilience.EventBudgetExceeded))
		}
		fmt.Fprintf(&s, "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %s | %s | %s | %s | %s |\n", r.client, len(r.calls), r.served(),
			ms(r.quantile(0.5)), ms(r.quantile(0.99)), ms(r.quantile(1)), r.attemptsPerCall(), strings.Join(outs, ", "),
			opened, held, refused, strings.Join(r.notes, "; "))
	}
	if len(errs) > 0 {
		s.WriteString("\nErrors (the first of each class):\n\n")
		for _, e := range errs {
			s.WriteString("- " + e + "\n")
		}
	}
	fmt.Fprintf(&s, "\nGoroutines: %d before the case, %d after it (everything stopped).\n", res.before, res.after)
	return s.String()
}

func atTrim(s string, n int) string {
	s = strings.ReplaceAll(s, "`", "'")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// atHeader says how the results were made.
func atHeader(wall time.Duration, loadBefore, loadAfter string) string {
	var env []string
	for _, k := range []string{"ATTEMPT_OUT", "ATTEMPT_DURATION"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	bench := "^BenchmarkAttemptTimeout$"
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		bench = f.Value.String()
	}
	env = append(env, fmt.Sprintf("go test -run '^$' -bench '%s' -benchtime 1x -timeout 30m .", bench))
	o := atOptions()
	var s strings.Builder
	fmt.Fprintf(&s, "# Attempt timeout: issue 47's cases\n\n")
	fmt.Fprintf(&s, "Run %s, %s, commit %s, %d cores, load before %s, after %s; the experiment took %v. In bench/: `%s`.\n\n",
		time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), fleetCommit(), runtime.NumCPU(), loadBefore, loadAfter,
		wall.Round(time.Second), strings.Join(env, " "))
	fmt.Fprintf(&s, "Clients, side by side, each on its own identical loopback upstream (httptest, HTTP/1.1): "+
		"**defaults**: the standard handler scaled as issue 47 says, AttemptTimeout %v, TotalTimeout %v, Retry.Delay %v, CircuitBreaker.SamplingDuration %v, "+
		"every other field zero (the defaults at this commit); **strict**: the same with StrictAttemptTimeout; **bare**: http.Client{Timeout: %v}. "+
		"A case's own options apply to defaults and strict. Case 3 runs the clients one after another.\n\n",
		o.AttemptTimeout, o.TotalTimeout, o.Retry.Delay, o.CircuitBreaker.SamplingDuration, atTotal)
	s.WriteString("**served %**: calls that got a 200 and read its body. **p50, p99, max**: every call's latency, failures included. " +
		"**attempts/call**: requests that reached the upstream (all of its servers) per call. **outcomes**: calls by class: ok, status N, " +
		"the handler's errors (attempt_timeout, total_timeout, circuit_open, overloaded, budget_exhausted, rate_limited), " +
		"caller_deadline (the caller's context ended), client_timeout (bare's Timeout), else the error's ErrorType or transport_error. " +
		"**circuit opened**: EventCircuitOpened. **held**: EventAttemptHeld (an attempt waited past AttemptTimeout). " +
		"**budget refused**: EventBudgetExceeded (a retry or hedge the retry budget refused; the call then ends on its last attempt's outcome). " +
		"**Goroutines**: the process's, before each case and once everything in it stopped (2 s at most to settle).\n\n")
	return s.String()
}

// atDo makes one call, method to url, with a caller context of limit, and
// reads the body.
func atDo(c *http.Client, method, url string, limit time.Duration) atCall {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"item":1}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		panic(err)
	}
	t0 := time.Now()
	status := 0
	resp, err := c.Do(req)
	if err == nil {
		status = resp.StatusCode
		_, err = io.Copy(io.Discard, resp.Body)
		if cerr := resp.Body.Close(); err == nil {
			err = cerr
		}
	}
	call := atCall{lat: time.Since(t0), ok: err == nil && status == http.StatusOK, class: atClass(ctx, status, err)}
	if err != nil {
		call.err = err.Error()
	}
	return call
}

// atClass names a call's outcome.
func atClass(ctx context.Context, status int, err error) string {
	var ne net.Error
	var et interface{ ErrorType() string }
	switch {
	case err == nil && status == http.StatusOK:
		return "ok"
	case err == nil:
		return "status " + strconv.Itoa(status)
	case errors.Is(err, resilience.ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(err, resilience.ErrAttemptTimeout):
		return "attempt_timeout"
	case errors.Is(err, resilience.ErrTotalTimeout):
		return "total_timeout"
	case errors.Is(err, resilience.ErrOverloaded):
		return "overloaded"
	case errors.Is(err, resilience.ErrBudgetExhausted):
		return "budget_exhausted"
	case errors.Is(err, resilience.ErrRateLimited):
		return "rate_limited"
	case ctx.Err() != nil:
		return "caller_deadline"
	case errors.As(err, &ne) && ne.Timeout():
		return "client_timeout"
	case errors.As(err, &et) && et.ErrorType() != "":
		return et.ErrorType()
	}
	return "transport_error"
}

// atSequential makes n calls one at a time: call k starts every seconds
// after call 0 did, or when call k-1 ends if that is later.
func atSequential(n int, every time.Duration, call func(k int) atCall) []atCall {
	out := make([]atCall, n)
	start := time.Now()
	for k := range n {
		if wait := time.Until(start.Add(time.Duration(k) * every)); wait > 0 {
			time.Sleep(wait)
		}
		out[k] = call(k)
	}
	return out
}

// atOpenLoop starts call k at k/rate seconds, each in a goroutine of its
// own, for d, and returns when every call has.
func atOpenLoop(rate float64, d time.Duration, call func(k int) atCall) []atCall {
	n := atOpenCalls(rate, d)
	out := make([]atCall, n)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range n {
		if wait := time.Until(start.Add(time.Duration(float64(k) / rate * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[k] = call(k)
		}()
	}
	wg.Wait()
	return out
}

// atPeakGoroutines samples the process's goroutines every 5 ms until the
// function it returns is called, which returns the largest count seen.
func atPeakGoroutines() func() int {
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		peak := runtime.NumGoroutine()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				peak = max(peak, runtime.NumGoroutine())
			case <-stop:
				done <- peak
				return
			}
		}
	}()
	return func() int {
		close(stop)
		return <-done
	}
}

// An atClient is one of atClientNames built over its own base transport.
type atClient struct {
	*http.Client
	base *http.Transport
	ev   *atEvents // nil for bare
}

// newAtClient builds client over a loopback transport; mod changes the
// handler's options (defaults and strict), nil keeps them.
func newAtClient(tb testing.TB, client string, mod func(*resilience.Options)) *atClient {
	return newAtClientOver(tb, client, nil, mod)
}

// newAtClientOver is newAtClient with rr, when not nil, between the client
// and its loopback transport.
func newAtClientOver(tb testing.TB, client string, rr *atRoundRobin, mod func(*resilience.Options)) *atClient {
	tb.Helper()
	c := &atClient{base: loopbackTransport()}
	var base http.RoundTripper = c.base
	if rr != nil {
		rr.base = c.base
		base = rr
	}
	switch client {
	case "bare":
		c.Client = &http.Client{Transport: base, Timeout: atTotal}
		return c
	case "defaults", "strict":
	default:
		panic("no client " + client)
	}
	o := atOptions()
	o.StrictAttemptTimeout = client == "strict"
	if mod != nil {
		mod(&o)
	}
	c.ev = newAtEvents()
	o.OnEvent = c.ev.note
	t, err := resilience.NewTransport(base, o)
	if err != nil {
		// not Fatal: the clients of a case run in goroutines of their own
		tb.Errorf("%s: %v", client, err)
		c.Client = &http.Client{Transport: atFailing{err}}
		return c
	}
	c.Client = &http.Client{Transport: t}
	return c
}

func (c *atClient) close() {
	c.CloseIdleConnections()
	c.base.CloseIdleConnections()
}

// atFailing fails every request with its error.
type atFailing struct{ err error }

func (f atFailing) RoundTrip(*http.Request) (*http.Response, error) { return nil, f.err }

// atRoundRobin sends each request to the next of hosts in turn: a
// client-side balancer under the handler, which sees one URL.
type atRoundRobin struct {
	base  http.RoundTripper
	hosts []string
	next  atomic.Int64
}

func (rr *atRoundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Host = rr.hosts[int(rr.next.Add(1)-1)%len(rr.hosts)]
	r.Host = ""
	return rr.base.RoundTrip(r)
}

func (rr *atRoundRobin) CloseIdleConnections() {
	if c, ok := rr.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// atEvents counts a handler's events.
type atEvents struct {
	mu        sync.Mutex
	start     time.Time // begin's time, for firstOpen
	opened    int
	firstOpen time.Duration  // since start; -1 before the first opening
	openedOn  map[string]int // by Event.Host, scheme://host:port
	kinds     map[resilience.EventKind]int
}

func newAtEvents() *atEvents {
	return &atEvents{start: time.Now(), firstOpen: -1, openedOn: map[string]int{}, kinds: map[resilience.EventKind]int{}}
}

// begin marks the start of the traffic, from which firstOpen counts.
func (e *atEvents) begin() {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.start = time.Now()
	e.mu.Unlock()
}

func (e *atEvents) note(ev resilience.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kinds[ev.Kind]++
	if ev.Kind == resilience.EventCircuitOpened {
		e.opened++
		if ev.Host != "" { // with Endpoints or PerHost: the endpoint's authority
			e.openedOn[ev.Host]++
		}
		if e.firstOpen < 0 {
			e.firstOpen = time.Since(e.start)
		}
	}
}

func (e *atEvents) count(k resilience.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kinds[k]
}

// add sums o's counts into e; either may be nil.
func (e *atEvents) add(o *atEvents) {
	if e == nil || o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.opened += o.opened
	for k, n := range o.openedOn {
		e.openedOn[k] += n
	}
	for k, n := range o.kinds {
		e.kinds[k] += n
	}
}

func (e *atEvents) firstOpenedString() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.firstOpen < 0 {
		return "never"
	}
	return fmt.Sprintf("at %.2f s", e.firstOpen.Seconds())
}

// An atUpstream is a loopback server that counts the requests it receives
// and the connections it accepts, and holds what it hangs until close.
type atUpstream struct {
	*httptest.Server
	requests atomic.Int64
	conns    atomic.Int64
	stop     chan struct{} // closed by close: every hung handler returns
	mu       sync.Mutex
	hijacked []net.Conn     // closed by close
	held     sync.WaitGroup // handlers of hijacked connections
}

// atConnKey's value in a request's context counts its connection's
// requests (an *atomic.Int64).
type atConnKey struct{}

func newAtUpstream(tb testing.TB, h func(u *atUpstream, w http.ResponseWriter, r *http.Request)) *atUpstream {
	tb.Helper()
	u := &atUpstream{stop: make(chan struct{})}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		h(u, w, r)
	}))
	u.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, atConnKey{}, new(atomic.Int64))
	}
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.Start()
	return u
}

// close ends the hung handlers and the hijacked connections, then the
// server. Call it once the client's calls have all returned.
func (u *atUpstream) close() {
	close(u.stop)
	u.mu.Lock()
	for _, c := range u.hijacked {
		c.Close()
	}
	u.mu.Unlock()
	u.held.Wait()
	u.CloseClientConnections()
	u.Close()
}

// hijack takes w's connection from the server; close closes it.
func (u *atUpstream) hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, bool) {
	conn, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return nil, nil, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.stop:
		conn.Close()
		return nil, nil, false
	default:
	}
	u.hijacked = append(u.hijacked, conn)
	u.held.Add(1)
	return conn, rw, true
}

// silence takes w's connection and never writes to it again: it reads
// until the client closes it, or close does.
func (u *atUpstream) silence(w http.ResponseWriter) {
	conn, rw, ok := u.hijack(w)
	if !ok {
		return
	}
	defer u.held.Done()
	_, _ = io.Copy(io.Discard, rw)
	conn.Close()
}

// earlyHints takes w's connection and writes a 103 Early Hints on it
// every 2 ms, counted in n, until the write fails or close is called.
func (u *atUpstream) earlyHints(w http.ResponseWriter, n *atomic.Int64) {
	conn, _, ok := u.hijack(w)
	if !ok {
		return
	}
	defer u.held.Done()
	defer conn.Close()
	hint := []byte("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n")
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := conn.Write(hint); err != nil {
			return
		}
		n.Add(1)
		select {
		case <-t.C:
		case <-u.stop:
			return
		}
	}
}

// atHangs accepts the request and never answers it: it returns when the
// client goes or the upstream closes.
func atHangs(u *atUpstream, _ http.ResponseWriter, r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-u.stop:
	}
}

// atAnswers answers 200 "ok" at once.
func atAnswers(_ *atUpstream, w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("ok"))
}

// atFirstHangs returns a handler that hangs the first request of each
// call (its query's k) and answers the others 200 at once.
func atFirstHangs() func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
	var seen sync.Map
	return func(u *atUpstream, w http.ResponseWriter, r *http.Request) {
		if _, again := seen.LoadOrStore(r.URL.Query().Get("k"), true); !again {
			atHangs(u, w, r)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}
}
