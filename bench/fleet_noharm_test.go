package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience"
)

// Issue 31's no-harm probes, one process: where nothing is overloaded, does
// the handler serve at least what a bare client serves, and what the same
// handler with its overload limiter off serves? Three kinds run side by
// side in every probe, each against its own identical upstream, on the same
// arrivals: bare, the handler's defaults (scaled as the overload and fleet
// experiments scale them, dnhOptions) and the same with Overload.Disabled
// (fleetKinds). The machinery is the fleet experiment's (runFleetWith,
// fleetDo, fleetCounters); each probe reports served % per kind and the
// handler's refusals by kind (the overload limiter's, the retry budget's,
// the open circuit's), and is judged against issue 31's targets unless the
// machine was too loaded to judge (nhJudge).

// The probes' kinds, in fleetKinds' names.
const (
	nhBare = "bare"
	nhLib  = "resilience"
	nhOff  = "resilience (limiter off)"
)

var nhKindNames = []string{nhBare, nhLib, nhOff}

// nhKinds are the probes' kinds, in nhKindNames' order.
func nhKinds() []fleetKind {
	var ks []fleetKind
	for _, name := range nhKindNames {
		i := slices.IndexFunc(fleetKinds, func(k fleetKind) bool { return k.name == name })
		ks = append(ks, fleetKinds[i])
	}
	return ks
}

// The probes' loads and shapes (issue 31, "No harm, one process").
const (
	nhSteadyLoad   = 0.6                    // of C, steady and reconfig
	nhSpareLoad    = 0.3                    // of C, the step and the stalls: capacity to spare
	nhBurstCalls   = ovlBurstCalls          // 500 at once
	nhColdCallers  = 100                    // closed-loop callers starting at once
	nhColdFor      = 20 * time.Second       // how long they call
	nhColdService  = 100 * time.Millisecond // the cold-start upstream's answer time
	nhColdSlow     = 400 * time.Millisecond // 2% of its answers: over the 200 ms attempt timeout
	nhColdSlowPct  = 2
	nhColdEarly    = 5 * time.Second // the note splits the calls here: the start, and after it
	nhStarveFor    = 4 * time.Second // the client's CPU starved
	nhStarveSpin   = 4               // busy goroutines in the child
	nhReconfEvery  = 100 * time.Millisecond
	nhLagTooLoaded = 20 * time.Millisecond // arrivals' p99 lateness over this: too loaded to judge
)

// nhSide is one kind in one probe.
type nhSide struct {
	Kind     string
	Calls    int
	OK       int
	Outcomes [fleetOutcomes]int
	// During and after a probe's trigger (the step, the stall, the
	// starvation): calls started in [at, at+dur) and [at+dur, end), and of
	// them served; zero without a trigger
	CallsDuring, OKDuring, CallsAfter, OKAfter int
	Totals                                     fleetTotalsJSON
}

// fleetTotalsJSON is fleetTotals with exported fields, for the starved
// probe's child to hand back.
type fleetTotalsJSON struct {
	Shed, BudgetRefused, CircuitRejected, AttemptTimeouts, Retries, Attempts int64
}

func nhTotals(t fleetTotals) fleetTotalsJSON {
	return fleetTotalsJSON{Shed: t.shed, BudgetRefused: t.budgetRefused, CircuitRejected: t.circuitRejected,
		AttemptTimeouts: t.attemptTimeouts, Retries: t.retries, Attempts: t.attempts}
}

func (s nhSide) pct() float64 { return nhPct(s.OK, s.Calls) }

func nhPct(ok, n int) float64 {
	if n == 0 {
		return 100
	}
	return 100 * float64(ok) / float64(n)
}

// nhResult is one probe's run.
type nhResult struct {
	probe      string
	seed       uint64
	sides      []nhSide
	lagP99     time.Duration // arrivals' lateness, p99 (the starved probe: before the starvation); 0 if closed loop
	cpu        float64       // process CPU / wall, cores (the starved probe: the parent's)
	wall       time.Duration
	phases     bool   // During/After are filled
	note       string // what the probe measured beside the table
	updateErrs int    // reconfig: Updates that failed
}

func (r nhResult) side(kind string) nhSide {
	for _, s := range r.sides {
		if s.Kind == kind {
			return s
		}
	}
	return nhSide{Kind: kind}
}

// An nhProbe is a row of the report.
type nhProbe struct {
	name string
	doc  string
	// margin: the handler may serve this many points fewer than bare
	// (issue 31: 0.5 for steady, 1 elsewhere); it may serve 1 point fewer
	// than the limiter-off handler
	margin float64
	// bareFloor is bare's calibration: the served % it reaches on a
	// machine that is not too loaded (the starved probe: before the
	// starvation); below it the probe is not judged
	bareFloor float64
	run       func(tb testing.TB, seed uint64) nhResult
}

// nhFleetSides turns a fleet run into the probe's sides, splitting at the
// trigger (if any).
func nhFleetSides(r fleetRun) []nhSide {
	tr := r.cfg.trigger
	var out []nhSide
	for _, s := range r.sides {
		ns := nhSide{Kind: s.kind, Calls: len(s.calls), Totals: nhTotals(s.totals)}
		for i, c := range s.calls {
			ns.Outcomes[s.outcomes[i]]++
			if c.ok {
				ns.OK++
			}
			if tr.dur > 0 && c.start >= tr.at {
				if c.start < tr.at+tr.dur {
					ns.CallsDuring++
					if c.ok {
						ns.OKDuring++
					}
				} else {
					ns.CallsAfter++
					if c.ok {
						ns.OKAfter++
					}
				}
			}
		}
		out = append(out, ns)
	}
	return out
}

// nhOpenLoop runs the three kinds at n replicas against the overload
// experiment's upstream (8 workers × 20 ms) with trigger tr, at load × C,
// over timeline tl; during as in fleetRunOpts.
func nhOpenLoop(tb testing.TB, name string, seed uint64, n int, load float64, tr ovlTrigger, h2 bool, tl fleetTimeline,
	during func(stop <-chan struct{}, clients [][]*http.Client),
) nhResult {
	tb.Helper()
	cfg := fleetConfig(tr, ovlModes[0], tl)
	cfg.h2 = h2
	r := runFleetWith(tb, nhKinds(), n, cfg, seed, tl, fleetRunOpts{rate: load * ovlCapacity, during: during})
	res := nhResult{probe: name, seed: seed, sides: nhFleetSides(r), lagP99: r.lagP99, cpu: r.cpu, wall: r.wall, phases: tr.dur > 0}
	if h2 {
		var arrived, over2 int
		for _, s := range r.sides {
			arrived += s.up.totals.arrivals
			over2 += s.up.h2
		}
		res.note = fmt.Sprintf("%d of %d attempts arrived over HTTP/2", over2, arrived)
	}
	return res
}

// nhProbes are the probes, in the report's order; FLEET_PROBES names a
// subset (steady runs both N; steady-1 or steady-200 one).
var nhProbes = []nhProbe{
	{"steady-1", "60% of C for 20 s, N = 1, no trigger", 0.5, 99.5, func(tb testing.TB, seed uint64) nhResult {
		return nhOpenLoop(tb, "steady-1", seed, 1, nhSteadyLoad, ovlTrigger{}, false, fleetTimeline{before: 20 * time.Second}, nil)
	}},
	{"steady-200", "60% of C for 20 s, N = 200 (each its own Handler and transport), no trigger", 0.5, 99.5, func(tb testing.TB, seed uint64) nhResult {
		return nhOpenLoop(tb, "steady-200", seed, 200, nhSteadyLoad, ovlTrigger{}, false, fleetTimeline{before: 20 * time.Second}, nil)
	}},
	{"burst", fmt.Sprintf("%d calls started at once against an upstream that answers at once, each kind in turn (bare, then the defaults, then limiter off)", nhBurstCalls), 1, 100, func(tb testing.TB, seed uint64) nhResult {
		return nhBurst(tb, "burst", seed, false)
	}},
	{"burst-together", fmt.Sprintf("the same, the three kinds' bursts at once: %d calls started at once in the process", 3*nhBurstCalls), 1, 100, func(tb testing.TB, seed uint64) nhResult {
		return nhBurst(tb, "burst-together", seed, true)
	}},
	{"step", "service ×3 for 4 s (C 400 → 133/s) at 30% of C (120/s), 4 s before, 4 s after", 1, 99, func(tb testing.TB, seed uint64) nhResult {
		tl := fleetTimeline{before: 4 * time.Second, trigger: 4 * time.Second, after: 4 * time.Second}
		return nhOpenLoop(tb, "step", seed, 1, nhSpareLoad, ovlTrigger{name: "step3x", at: tl.before, dur: tl.trigger, slow: 3}, false, tl, nil)
	}},
	{"stall-h2", "every worker stopped 2 s (services in progress pushed back), 30% of C, HTTP/2 over TLS, 4 s before, 6 s after", 1, 98, func(tb testing.TB, seed uint64) nhResult {
		return nhStall(tb, "stall-h2", seed, true)
	}},
	{"stall-h1", "the same stall over HTTP/1.1", 1, 98, func(tb testing.TB, seed uint64) nhResult {
		return nhStall(tb, "stall-h1", seed, false)
	}},
	{"starved", fmt.Sprintf("the clients in a child process with GOMAXPROCS=1 and %d goroutines spinning for %v, 60%% of C against a healthy upstream in the parent, 4 s before, 4 s after", nhStarveSpin, nhStarveFor), 1, 99.5, nhStarved},
	{"coldstart", fmt.Sprintf("%d closed-loop callers starting at once for %v; the upstream (no queue) answers in %v, %d%% of answers (seeded) in %v", nhColdCallers, nhColdFor, nhColdService, nhColdSlowPct, nhColdSlow), 1, 99.5, nhColdStart},
	{"reconfig", fmt.Sprintf("Handler.Update every %v alternating AttemptTimeout 200/250 ms and Overload.MaxQueueWait 67/100 ms, 60%% of C for 10 s", nhReconfEvery), 1, 99.5, nhReconfig},
}

// nhStall is the stall probe over HTTP/2 (h2) or HTTP/1.1.
func nhStall(tb testing.TB, name string, seed uint64, h2 bool) nhResult {
	tb.Helper()
	tl := fleetTimeline{before: 4 * time.Second, trigger: fleetStall, after: 6 * time.Second}
	return nhOpenLoop(tb, name, seed, 1, nhSpareLoad, ovlTrigger{name: "stall2s", at: tl.before, dur: tl.trigger, stall: true}, h2, tl, nil)
}

// nhReconfig alternates two sets of options on every Handler every
// nhReconfEvery (the limiter-off kind keeps its limiter off: Options
// returns Disabled, and only the two fields change).
func nhReconfig(tb testing.TB, seed uint64) nhResult {
	tb.Helper()
	return nhReconfigFor(tb, seed, fleetTimeline{before: 10 * time.Second})
}

// nhReconfigFor is the reconfig probe over timeline tl.
func nhReconfigFor(tb testing.TB, seed uint64, tl fleetTimeline) nhResult {
	tb.Helper()
	var updates, failed atomic.Int64
	during := func(stop <-chan struct{}, clients [][]*http.Client) {
		tick := time.NewTicker(nhReconfEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			attempt, wait := 200*time.Millisecond, shipped().Overload.MaxQueueWait/15
			if i%2 == 0 {
				attempt, wait = 250*time.Millisecond, 100*time.Millisecond
			}
			for _, cs := range clients {
				for _, c := range cs {
					t, ok := c.Transport.(*resilience.Transport)
					if !ok {
						continue
					}
					h := t.Handler()
					o := h.Options()
					o.AttemptTimeout, o.Overload.MaxQueueWait = attempt, wait
					updates.Add(1)
					if err := h.Update(o); err != nil {
						failed.Add(1)
					}
				}
			}
		}
	}
	r := nhOpenLoop(tb, "reconfig", seed, 1, nhSteadyLoad, ovlTrigger{}, false, tl, during)
	r.updateErrs = int(failed.Load())
	r.note = fmt.Sprintf("%d Updates, %d failed", updates.Load(), failed.Load())
	return r
}

// nhBuild builds one replica of every kind over fresh transports to srv
// (each kind its own server), returning the clients, their counters and a
// func that closes the transports' idle connections.
func nhBuild(tb testing.TB, urls []string) (clients []*http.Client, counters []*fleetCounters, done func()) {
	tb.Helper()
	var trs []*http.Transport
	done = func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
		for _, t := range trs {
			t.CloseIdleConnections()
		}
	}
	for _, k := range nhKinds() {
		tr := loopbackTransport()
		trs = append(trs, tr)
		cs := new(fleetCounters)
		c, err := k.new(fleetBase{next: ovlBase{base: tr, reg: newOVLRegistry()}, gauge: new(fleetGauge)}, cs)
		if err != nil {
			done()
			tb.Fatalf("%s: %v", k.name, err)
		}
		clients = append(clients, c)
		counters = append(counters, cs)
	}
	return clients, counters, done
}

// nhBurst starts nhBurstCalls calls at once on every kind, each kind
// against its own server that answers at once: the kinds' bursts at the
// same time if together, else one kind after another, so that each burst
// meets a process doing nothing else.
func nhBurst(tb testing.TB, name string, seed uint64, together bool) nhResult {
	tb.Helper()
	var urls []string
	for range nhKindNames {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(ovlOKBody)))
			_, _ = w.Write(ovlOKBody)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	clients, counters, done := nhBuild(tb, urls)
	defer done()
	outcomes := make([][]fleetOutcome, len(clients))
	cpu0, t0 := ovlCPUTime(), time.Now()
	burst := func(kinds []int) {
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for _, i := range kinds {
			c := clients[i]
			outcomes[i] = make([]fleetOutcome, nhBurstCalls)
			for k := range nhBurstCalls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					outcomes[i][k] = fleetDo(c, urls[i])
				}()
			}
		}
		close(gate)
		wg.Wait()
	}
	if together {
		burst([]int{0, 1, 2})
	} else {
		for i := range clients {
			burst([]int{i})
		}
	}
	r := nhResult{probe: name, seed: seed, wall: time.Since(t0)}
	r.cpu = (ovlCPUTime() - cpu0).Seconds() / r.wall.Seconds()
	for i, name := range nhKindNames {
		s := nhSide{Kind: name, Calls: nhBurstCalls, Totals: nhTotals(sumFleet(counters[i : i+1]))}
		for _, o := range outcomes[i] {
			s.Outcomes[o]++
			if o == fleetOK {
				s.OK++
			}
		}
		r.sides = append(r.sides, s)
	}
	return r
}

// nhColdStart runs nhColdCallers closed-loop callers per kind, all kinds
// at once, each kind against its own server with no queue that answers in
// nhColdService, or in nhColdSlow for nhColdSlowPct% of its requests by
// arrival order from a generator seeded with seed (the same sequence for
// every kind).
func nhColdStart(tb testing.TB, seed uint64) nhResult {
	tb.Helper()
	return nhClosedLoop(tb, "coldstart", seed, nhColdFor)
}

func nhClosedLoop(tb testing.TB, name string, seed uint64, runFor time.Duration) nhResult {
	tb.Helper()
	var urls []string
	for range nhKindNames {
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(seed, 0xc01d))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			slow := rng.IntN(100) < nhColdSlowPct
			mu.Unlock()
			d := nhColdService
			if slow {
				d = nhColdSlow
			}
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done(): // the server is closing, or the caller left
				t.Stop()
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(ovlOKBody)))
			_, _ = w.Write(ovlOKBody)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	clients, counters, done := nhBuild(tb, urls)
	defer done()
	type tally struct {
		outcomes       [fleetOutcomes]int
		early, earlyOK int // calls started in the first nhColdEarly, and served
	}
	tallies := make([][]tally, len(clients))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	cpu0, t0 := ovlCPUTime(), time.Now()
	end := t0.Add(runFor)
	for i, c := range clients {
		tallies[i] = make([]tally, nhColdCallers)
		for j := range nhColdCallers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				for now := time.Now(); now.Before(end); now = time.Now() {
					o := fleetDo(c, urls[i])
					tl := &tallies[i][j]
					tl.outcomes[o]++
					if now.Sub(t0) < nhColdEarly {
						tl.early++
						if o == fleetOK {
							tl.earlyOK++
						}
					}
				}
			}()
		}
	}
	close(gate)
	wg.Wait()
	r := nhResult{probe: name, seed: seed, wall: time.Since(t0)}
	r.cpu = (ovlCPUTime() - cpu0).Seconds() / r.wall.Seconds()
	var early []string
	for i, kind := range nhKindNames {
		s := nhSide{Kind: kind, Totals: nhTotals(sumFleet(counters[i : i+1]))}
		var n, ok int
		for _, t := range tallies[i] {
			for o, v := range t.outcomes {
				s.Outcomes[o] += v
				s.Calls += v
			}
			n += t.early
			ok += t.earlyOK
		}
		s.OK = s.Outcomes[fleetOK]
		r.sides = append(r.sides, s)
		early = append(early, fmt.Sprintf("%s %.1f%% of %d / %.1f%% of %d", kind, nhPct(ok, n), n, nhPct(s.OK-ok, s.Calls-n), s.Calls-n))
	}
	r.note = fmt.Sprintf("served in the first %v / after: %s", nhColdEarly, strings.Join(early, "; "))
	return r
}

// The starved probe's child: the parent re-runs the test binary with
// nhChildEnv set to a JSON nhChildSpec; TestFleetNoHarmStarvedChild, in
// the child, plays the arrivals through one replica of each kind against
// the parent's upstreams, starves its own CPU for nhStarveFor after
// spec.Before, and writes an nhChildResult as JSON to spec.Out.
const nhChildEnv = "FLEET_NOHARM_STARVED_CHILD"

type nhChildSpec struct {
	URLs   []string // one per kind, in nhKindNames' order
	Seed   uint64
	Rate   float64 // arrivals per second
	Before time.Duration
	Starve time.Duration
	After  time.Duration
	Spin   int    // busy goroutines
	Out    string // where to write the result
}

type nhChildResult struct {
	Sides      []nhSide
	LagBefore  time.Duration // p99 lateness of the arrivals before the starvation
	LagDuring  time.Duration // and during it: how starved the process was
	GOMAXPROCS int
}

// nhStarved runs the clients in a child process whose CPU is starved; the
// upstreams (the overload experiment's, healthy) stay here.
func nhStarved(tb testing.TB, seed uint64) nhResult {
	tb.Helper()
	tl := fleetTimeline{before: 4 * time.Second, trigger: nhStarveFor, after: 4 * time.Second}
	cfg := fleetConfig(ovlTrigger{}, ovlModes[0], tl)
	spec := nhChildSpec{Seed: seed, Rate: nhSteadyLoad * ovlCapacity, Before: tl.before, Starve: tl.trigger, After: tl.after,
		Spin: nhStarveSpin, Out: filepath.Join(tb.TempDir(), "starved.json")}
	var ups []*ovlUpstream
	for range nhKindNames {
		u := newOVLUpstream(cfg, newOVLRegistry())
		ups = append(ups, u)
		spec.URLs = append(spec.URLs, u.URL()+"/items")
	}
	js, err := json.Marshal(spec)
	require.NoError(tb, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFleetNoHarmStarvedChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), nhChildEnv+"="+string(js), "GOMAXPROCS=1")
	cpu0, t0 := ovlCPUTime(), time.Now()
	for _, u := range ups {
		u.begin(t0)
	}
	out, err := cmd.CombinedOutput()
	wall := time.Since(t0)
	for _, u := range ups {
		u.Close()
	}
	if err != nil {
		tb.Fatalf("starved child: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(spec.Out)
	require.NoError(tb, err)
	var res nhChildResult
	require.NoError(tb, json.Unmarshal(raw, &res))
	return nhResult{probe: "starved", seed: seed, sides: res.Sides, lagP99: res.LagBefore, wall: wall, phases: true,
		cpu:  (ovlCPUTime() - cpu0).Seconds() / wall.Seconds(),
		note: fmt.Sprintf("child GOMAXPROCS %d; its arrivals started late by %v at p99 before the starvation, %v during it", res.GOMAXPROCS, res.LagBefore.Round(time.Millisecond), res.LagDuring.Round(time.Millisecond))}
}

// TestFleetNoHarmStarvedChild is the starved probe's child process; it is
// skipped unless the parent started it (nhChildEnv).
func TestFleetNoHarmStarvedChild(t *testing.T) {
	js := os.Getenv(nhChildEnv)
	if js == "" {
		t.Skip("the starved probe's child process: run by BenchmarkFleetNoHarm")
	}
	var spec nhChildSpec
	require.NoError(t, json.Unmarshal([]byte(js), &spec))
	res := nhRunChild(t, spec)
	raw, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(spec.Out, raw, 0o644))
}

// nhRunChild plays spec's arrivals through one client of each kind, each to
// its URL, starving the process for spec.Starve from spec.Before.
func nhRunChild(tb testing.TB, spec nhChildSpec) nhChildResult {
	tb.Helper()
	clients, counters, done := nhBuild(tb, spec.URLs)
	defer done()
	runFor := spec.Before + spec.Starve + spec.After
	arrivals := ovlArrivals(spec.Seed, spec.Rate, runFor)
	calls := make([][]ovlCall, len(clients))
	outcomes := make([][]fleetOutcome, len(clients))
	for i := range clients {
		calls[i] = make([]ovlCall, len(arrivals))
		outcomes[i] = make([]fleetOutcome, len(arrivals))
	}
	lags := make([]time.Duration, len(arrivals))
	t0 := time.Now()
	var wg sync.WaitGroup
	var spinners sync.WaitGroup
	starveAt := time.AfterFunc(spec.Before, func() {
		end := t0.Add(spec.Before + spec.Starve)
		for range spec.Spin {
			spinners.Add(1)
			go func() {
				defer spinners.Done()
				for x := uint64(1); time.Now().Before(end); x = x*6364136223846793005 + 1 {
				}
			}()
		}
	})
	for k, at := range arrivals {
		if d := time.Until(t0.Add(at)); d > 0 {
			time.Sleep(d)
		}
		lags[k] = time.Since(t0) - at
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Since(t0)
				o := fleetDo(c, spec.URLs[i])
				calls[i][k] = ovlCall{start: start, end: time.Since(t0), ok: o == fleetOK}
				outcomes[i][k] = o
			}()
		}
	}
	wg.Wait()
	starveAt.Stop()
	spinners.Wait()
	res := nhChildResult{GOMAXPROCS: runtime.GOMAXPROCS(0)}
	var before, during []time.Duration
	for k, at := range arrivals {
		switch {
		case at < spec.Before:
			before = append(before, lags[k])
		case at < spec.Before+spec.Starve:
			during = append(during, lags[k])
		}
	}
	res.LagBefore, res.LagDuring = nhP99(before), nhP99(during)
	for i, kind := range nhKindNames {
		r := fleetRun{cfg: ovlUpstreamConfig{trigger: ovlTrigger{at: spec.Before, dur: spec.Starve}},
			sides: []fleetSide{{kind: kind, calls: calls[i], outcomes: outcomes[i], totals: sumFleet(counters[i : i+1])}}}
		res.Sides = append(res.Sides, nhFleetSides(r)...)
	}
	return res
}

func nhP99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}

// nhVerdict is a probe's run judged against issue 31's targets.
type nhVerdict struct {
	judged            bool   // false: the machine was too loaded to judge
	why               string // why not judged
	bare, lib, off    float64
	vsBare, vsOff     bool // lib ≥ bare − margin; lib ≥ off − 1
	calls             bool // lib served at least (100 − margin) % as many calls as bare: closed-loop callers make fewer calls when each waits longer
	noShed            bool // the overload limiter refused nothing
	lossless          bool // the burst: every call served
	met               bool
	barePre, preFloor float64
}

// nhJudged is the served % a probe is judged on: calls started from the
// trigger to the end when the probe has one (the quiet seconds before it
// dilute nothing), else every call.
func nhJudged(r nhResult, s nhSide) float64 {
	if r.phases {
		return nhPct(s.OKDuring+s.OKAfter, s.CallsDuring+s.CallsAfter)
	}
	return s.pct()
}

// nhJudge judges r by p's targets (issue 31, "Done when"): the handler
// serves ≥ bare's − p.margin and ≥ the limiter-off handler's − 1, and its
// overload limiter refuses nothing (every probe has capacity to spare);
// the burst loses nothing. Not judged when the machine was too loaded:
// bare below its calibration (p.bareFloor; with a trigger, before it), or
// the arrivals' p99 lateness over nhLagTooLoaded.
func nhJudge(p nhProbe, r nhResult) nhVerdict {
	b, l, o := r.side(nhBare), r.side(nhLib), r.side(nhOff)
	v := nhVerdict{bare: nhJudged(r, b), lib: nhJudged(r, l), off: nhJudged(r, o), preFloor: p.bareFloor}
	v.barePre = b.pct()
	if r.phases {
		v.barePre = nhPct(b.OK-b.OKDuring-b.OKAfter, b.Calls-b.CallsDuring-b.CallsAfter)
	}
	switch {
	case b.Calls == 0 || l.Calls == 0 || o.Calls == 0:
		v.why = "a kind made no calls"
	case v.barePre < p.bareFloor:
		v.why = fmt.Sprintf("bare served %.1f%%, under its calibration %.1f%%", v.barePre, p.bareFloor)
	case r.lagP99 > nhLagTooLoaded:
		v.why = fmt.Sprintf("arrivals started %v late at p99, over %v", r.lagP99.Round(time.Millisecond), nhLagTooLoaded)
	default:
		v.judged = true
	}
	v.vsBare = v.lib >= v.bare-p.margin
	v.calls = float64(l.OK)*100 >= float64(b.OK)*(100-p.margin)
	v.vsOff = v.lib >= v.off-1
	v.noShed = l.Totals.Shed == 0 && l.Outcomes[fleetOverloaded] == 0
	v.lossless = !strings.HasPrefix(p.name, "burst") || l.OK == l.Calls
	v.met = v.judged && v.vsBare && v.calls && v.vsOff && v.noShed && v.lossless && r.updateErrs == 0
	return v
}

func (v nhVerdict) String() string {
	if !v.judged {
		return "too loaded to judge (" + v.why + ")"
	}
	return fleetYes(v.met)
}

// nhParams are BenchmarkFleetNoHarm's choices, from the environment.
type nhParams struct {
	probes []nhProbe
	seeds  []uint64
	out    string
}

func nhParamsFromEnv(tb testing.TB) nhParams {
	tb.Helper()
	p := nhParams{out: "fleet-noharm"}
	names := fleetEnvList("FLEET_PROBES", "")
	for _, pr := range nhProbes {
		base, _, _ := strings.Cut(pr.name, "-")
		if len(names) == 0 || slices.Contains(names, pr.name) || ((base == "steady" || base == "stall") && slices.Contains(names, base)) {
			p.probes = append(p.probes, pr)
		}
	}
	for _, f := range fleetEnvList("FLEET_SEEDS", "1") {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			tb.Fatalf("FLEET_SEEDS: %v", err)
		}
		p.seeds = append(p.seeds, v)
	}
	if s := os.Getenv("FLEET_OUT"); s != "" {
		p.out = s
	}
	if len(p.probes) == 0 {
		tb.Fatalf("FLEET_PROBES selects nothing (the probes: steady, steady-1, steady-200, burst, burst-together, step, stall-h2, stall-h1, starved, coldstart, reconfig)")
	}
	return p
}

// BenchmarkFleetNoHarm runs issue 31's no-harm probes once, whatever b.N
// (run it with -benchtime 1x): for every seed and probe, bare, the
// handler's defaults and the handler with its limiter off side by side; it
// writes results/fleet-noharm.md (FLEET_OUT=name: results/name.md).
// FLEET_PROBES=burst,step chooses probes (steady is both N, stall both
// protocols), FLEET_SEEDS
// the seeds (default 1). All probes take about 2.5 minutes a seed.
func BenchmarkFleetNoHarm(b *testing.B) {
	p := nhParamsFromEnv(b)
	la0 := ovlLoadAvg()
	start := time.Now()
	var runs []nhResult
	for _, seed := range p.seeds {
		for _, pr := range p.probes {
			r := pr.run(b, seed)
			runs = append(runs, r)
			v := nhJudge(pr, r)
			fmt.Fprintf(os.Stderr, "fleet no-harm %-10s seed %d  bare %6.2f%%  resilience %6.2f%%  limiter off %6.2f%%  shed %d (ErrOverloaded %d)  budget %d  circuit %d  lag p99 %v  cpu %.2f  %s\n",
				pr.name, seed, v.bare, v.lib, v.off, r.side(nhLib).Totals.Shed, r.side(nhLib).Outcomes[fleetOverloaded],
				r.side(nhLib).Totals.BudgetRefused, r.side(nhLib).Totals.CircuitRejected, r.lagP99.Round(time.Millisecond), r.cpu, v)
		}
	}
	md := nhMarkdown(p, runs, time.Since(start), la0, ovlLoadAvg())
	fmt.Print(md)
	if err := os.MkdirAll("results", 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("results", p.out+".md"), []byte(md), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/op")
}

// nhCommand is the go test command line that makes the report.
func nhCommand() string {
	var env []string
	for _, k := range []string{"FLEET_PROBES", "FLEET_SEEDS", "FLEET_OUT"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	env = append(env, "go test -run '^$' -bench '^BenchmarkFleetNoHarm$' -benchtime 1x -timeout 30m .")
	return strings.Join(env, " ")
}

// nhMarkdown is the report: how it was run, the probes, one row per run
// with its verdict, the phases of the probes with a trigger, and each
// kind's failures.
func nhMarkdown(p nhParams, runs []nhResult, wall time.Duration, la0, la1 string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	probe := func(name string) nhProbe {
		i := slices.IndexFunc(nhProbes, func(pr nhProbe) bool { return pr.name == name })
		return nhProbes[i]
	}
	o := dnhOptions()
	w("# Fleet, no harm, one process (issue 31)\n\n")
	w("Run %s, %s, commit %s, %d cores, load before %s, after %s; took %v. In bench/: `%s`.\n\n",
		time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), fleetCommit(), runtime.NumCPU(), la0, la1, wall.Round(time.Second), nhCommand())
	w("Kinds, side by side in every probe, each against its own identical upstream, on the same arrivals: `%s` (http.Client, Timeout %v); "+
		"`%s` (the handler's defaults, scaled: AttemptTimeout %v, TotalTimeout %v, Overload.MaxQueueWait %v); `%s` (the same with Overload.Disabled). "+
		"Every call has a %v deadline. Unless said, the upstream is the overload experiment's: %d workers × %v, one FIFO queue, C = %.0f calls/s, open-loop Poisson arrivals.\n\n",
		nhBare, ovlCallerDeadline, nhLib, o.AttemptTimeout, o.TotalTimeout, o.Overload.MaxQueueWait, nhOff, ovlCallerDeadline, ovlWorkers, ovlService, ovlCapacity)
	w("Probes:\n\n")
	for _, pr := range p.probes {
		w("- `%s`: %s. Target: ≥ bare − %.1f, as many calls served as bare less %[3]v %%, ≥ limiter off − 1, 0 overload refusals%s; bare's calibration %.1f%%.\n", pr.name, pr.doc, pr.margin,
			map[bool]string{true: ", every call served", false: ""}[strings.HasPrefix(pr.name, "burst")], pr.bareFloor)
	}
	w("\nColumns: **served %%**: calls served (200, body read); with a trigger (step, stalls, starved), of the calls started from the trigger to the end, which is what is judged. "+
		"**calls served**: the handler's served calls against bare's, the whole run; the same arrivals make them equal unless callers wait on each call (closed loop), where a client that makes each call wait longer makes fewer. "+
		"**overload refusals**: EventOverloadShed (calls that failed with ErrOverloaded); **budget**: EventBudgetExceeded; **circuit**: EventCircuitRejected (calls that failed with ErrCircuitOpen); "+
		"**attempt timeouts**: EventAttemptTimeout. **lag p99**: how late the arrivals started against their schedule (the starved probe: the child's, before the starvation; closed-loop and burst probes have none). "+
		"A run is not judged when bare served less than its calibration (the starved probe and those with a trigger: before it) or the lag is over %v: the machine was too loaded to judge.\n\n", nhLagTooLoaded)
	w("| probe | seed | bare served %% | resilience served %% | limiter off served %% | resilience: overload refusals (calls) / budget / circuit (calls) / attempt timeouts | limiter off: budget / circuit / attempt timeouts | ≥ bare − m | calls served ≥ bare's − m %% | ≥ limiter off − 1 | 0 overload refusals | met |\n")
	w("|---|---:|---:|---:|---:|---|---|---|---|---|---|---|\n")
	met, judged := 0, 0
	for _, r := range runs {
		pr := probe(r.probe)
		v := nhJudge(pr, r)
		l, of := r.side(nhLib), r.side(nhOff)
		noShed := fleetYes(v.noShed)
		if strings.HasPrefix(pr.name, "burst") {
			noShed += fmt.Sprintf("; lost %d", l.Calls-l.OK)
		}
		w("| %s | %d | %.2f | %.2f | %.2f | %d (%d) / %d / %d (%d) / %d | %d / %d / %d | %s | %s (%d of %d) | %s | %s | %s |\n", r.probe, r.seed, v.bare, v.lib, v.off,
			l.Totals.Shed, l.Outcomes[fleetOverloaded], l.Totals.BudgetRefused, l.Totals.CircuitRejected, l.Outcomes[fleetCircuitOpen], l.Totals.AttemptTimeouts,
			of.Totals.BudgetRefused, of.Totals.CircuitRejected, of.Totals.AttemptTimeouts,
			fleetYes(v.vsBare), fleetYes(v.calls), l.OK, r.side(nhBare).OK, fleetYes(v.vsOff), noShed, v)
		if v.judged {
			judged++
			if v.met {
				met++
			}
		}
	}
	w("\nMet in %d of %d runs judged (%d not judged).\n\n", met, judged, len(runs)-judged)

	w("## Phases\n\nServed %% of the calls started before the trigger / during it / after it, per kind.\n\n")
	w("| probe | seed | bare | resilience | limiter off |\n|---|---:|---|---|---|\n")
	for _, r := range runs {
		if !r.phases {
			continue
		}
		w("| %s | %d |", r.probe, r.seed)
		for _, k := range nhKindNames {
			s := r.side(k)
			w(" %.1f / %.1f / %.1f |", nhPct(s.OK-s.OKDuring-s.OKAfter, s.Calls-s.CallsDuring-s.CallsAfter), nhPct(s.OKDuring, s.CallsDuring), nhPct(s.OKAfter, s.CallsAfter))
		}
		w("\n")
	}
	w("\n## Every run\n\n**failures**: calls that failed, by what the caller saw: timeout / ErrOverloaded / ErrCircuitOpen / a status other than 200 / other. **cpu**: the process's CPU time / wall time, in cores.\n\n")
	w("| probe | seed | kind | calls | served | failures | attempts | retries | lag p99 | cpu | wall | note |\n|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range runs {
		for _, s := range r.sides {
			w("| %s | %d | %s | %d | %d | %d / %d / %d / %d / %d | %d | %d | %v | %.2f | %v | %s |\n", r.probe, r.seed, s.Kind, s.Calls, s.OK,
				s.Outcomes[fleetTimeout], s.Outcomes[fleetOverloaded], s.Outcomes[fleetCircuitOpen], s.Outcomes[fleetStatus], s.Outcomes[fleetOther],
				s.Totals.Attempts, s.Totals.Retries, r.lagP99.Round(time.Millisecond), r.cpu, r.wall.Round(100*time.Millisecond), r.note)
		}
	}
	return b.String()
}

// TestFleetNoHarmSmoke checks the no-harm harness, not the clients, on two
// cheap probes: the burst, and 1.5 s of the reconfig probe (open loop at
// 60% of C with Updates every 100 ms). Every call of every kind ends and
// is counted once; the phases and counters add up; the Updates ran and
// none failed; nothing is left running. It asserts nothing about which
// kind does better, and nothing about time.
func TestFleetNoHarmSmoke(t *testing.T) {
	defer goleak.VerifyNone(t)
	check := func(t *testing.T, r nhResult, calls int) {
		require.Len(t, r.sides, len(nhKindNames))
		for i, s := range r.sides {
			assert.Equal(t, nhKindNames[i], s.Kind)
			assert.Equal(t, calls, s.Calls, "%s: one call per arrival", s.Kind)
			sum := 0
			for _, n := range s.Outcomes {
				sum += n
			}
			assert.Equal(t, s.Calls, sum, "%s: every call counted once", s.Kind)
			assert.Zero(t, s.Outcomes[fleetPending], "%s: every call ended", s.Kind)
			assert.Equal(t, s.Outcomes[fleetOK], s.OK, s.Kind)
			assert.LessOrEqual(t, s.CallsDuring+s.CallsAfter, s.Calls)
			assert.LessOrEqual(t, s.OKDuring+s.OKAfter, s.OK)
			tot := s.Totals
			for _, v := range []int64{tot.Shed, tot.BudgetRefused, tot.CircuitRejected, tot.AttemptTimeouts, tot.Retries, tot.Attempts} {
				assert.GreaterOrEqual(t, v, int64(0))
			}
			if s.Kind == nhBare {
				assert.Equal(t, fleetTotalsJSON{}, tot, "no Handler, no events")
			} else {
				assert.GreaterOrEqual(t, tot.Attempts-tot.Retries, int64(s.Calls-s.Outcomes[fleetOverloaded]-s.Outcomes[fleetCircuitOpen]),
					"%s: a call not refused sent a first attempt", s.Kind)
				assert.GreaterOrEqual(t, tot.Shed, int64(s.Outcomes[fleetOverloaded]))
			}
		}
		v := nhJudge(nhProbes[0], r)
		assert.False(t, v.met && !v.judged, "a verdict needs a judgement")
	}
	t.Run("burst", func(t *testing.T) {
		check(t, nhBurst(t, "burst", 1, false), nhBurstCalls)
	})
	t.Run("reconfig", func(t *testing.T) {
		tl := fleetTimeline{before: 1500 * time.Millisecond}
		r := nhReconfigFor(t, 1, tl)
		check(t, r, len(ovlArrivals(1, nhSteadyLoad*ovlCapacity, tl.runFor())))
		assert.Zero(t, r.updateErrs, "every Update was valid")
		assert.Contains(t, r.note, "Updates")
		assert.NotContains(t, r.note, " 0 Updates", "the Updates ran")
	})
}

// TestFleetNoHarmJudge checks the targets and the too-loaded check on
// made-up runs.
func TestFleetNoHarmJudge(t *testing.T) {
	side := func(kind string, calls, ok int, shed int64) nhSide {
		s := nhSide{Kind: kind, Calls: calls, OK: ok, Totals: fleetTotalsJSON{Shed: shed}}
		s.Outcomes[fleetOK] = ok
		s.Outcomes[fleetOverloaded] = int(shed)
		s.Outcomes[fleetTimeout] = calls - ok - int(shed)
		return s
	}
	steady := nhProbes[0]
	run := func(bare, lib, off int, shed int64) nhResult {
		return nhResult{probe: steady.name, sides: []nhSide{side(nhBare, 1000, bare, 0), side(nhLib, 1000, lib, shed), side(nhOff, 1000, off, 0)}}
	}
	v := nhJudge(steady, run(1000, 996, 1000, 0))
	assert.True(t, v.judged)
	assert.True(t, v.met, "0.4 points under bare: within 0.5")
	v = nhJudge(steady, run(1000, 994, 1000, 0))
	assert.False(t, v.met, "0.6 points under bare")
	assert.False(t, v.vsBare)
	v = nhJudge(steady, run(1000, 1000, 1000, 1))
	assert.False(t, v.met, "one overload refusal")
	assert.False(t, v.noShed)
	v = nhJudge(steady, run(990, 1000, 1000, 0))
	assert.False(t, v.judged, "bare under its calibration")
	assert.Contains(t, v.String(), "too loaded")
	r := run(1000, 1000, 1000, 0)
	r.lagP99 = 30 * time.Millisecond
	assert.False(t, nhJudge(steady, r).judged, "arrivals late")

	// with a trigger, the calls from it on are judged, and the calibration
	// is bare's before it
	step := nhProbes[slices.IndexFunc(nhProbes, func(p nhProbe) bool { return p.name == "step" })]
	ph := func(kind string, okFrom int) nhSide {
		s := side(kind, 1000, 500+okFrom, 0)
		s.CallsDuring, s.OKDuring, s.CallsAfter, s.OKAfter = 250, min(okFrom, 250), 250, max(0, okFrom-250)
		return s
	}
	r = nhResult{probe: "step", phases: true, sides: []nhSide{ph(nhBare, 500), ph(nhLib, 494), ph(nhOff, 500)}}
	v = nhJudge(step, r)
	assert.True(t, v.judged)
	assert.InDelta(t, 98.8, v.lib, 1e-9, "judged on the 500 calls from the trigger on")
	assert.False(t, v.met, "1.2 points under bare")
	r.sides[1] = ph(nhLib, 496)
	assert.True(t, nhJudge(step, r).met, "0.8 points under bare")
}
