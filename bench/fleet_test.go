package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
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
	"github.com/resilienthttp/resilience/server"
)

// The fleet experiment (issue 31): the overload experiment's upstream and
// load (overload_test.go, overload_upstream_test.go), met not by one client
// but by a fleet of N replicas in one process, each with its own Handler
// and its own http.Transport, all calling one upstream. Every kind of
// client (bare, go-retryablehttp, the handler's defaults) runs at the same
// time as the others, each fleet against its own identical upstream, on the
// same arrivals: one open-loop Poisson sequence at 80% of C, each call
// given to one of the N replicas uniformly at random by a generator seeded
// with the run's seed, the same replica number for every kind. A
// protection whose allowances are counts per Handler (a floor of attempts
// in flight, a budget of tokens, a breaker's minimum throughput) gives the
// fleet N times the allowance; this experiment shows what that does. The
// report is fleet_report_test.go.
//
// Time is the overload experiment's: attempt timeout 200 ms, caller
// deadline 2 s, 8 workers × 20 ms (C = 400 calls/s). The timeline is
// fleetFull: 4 s before the trigger, 4 s of trigger, 12 s after it.

// fleetTimeline is a run's shape: arrivals for before+trigger+after, the
// trigger from before to before+trigger.
type fleetTimeline struct{ before, trigger, after time.Duration }

func (tl fleetTimeline) runFor() time.Duration { return tl.before + tl.trigger + tl.after }

var (
	// fleetFull is the experiment's timeline (issue 31: 4 s, 4 s, 12 s).
	fleetFull = fleetTimeline{before: 4 * time.Second, trigger: 4 * time.Second, after: 12 * time.Second}
	// fleetQuick is FLEET_QUICK=1's: the same trigger, less before and after.
	fleetQuick = fleetTimeline{before: 2 * time.Second, trigger: 4 * time.Second, after: 4 * time.Second}
)

// fleetStall is how long the stall trigger stops every worker (issue 31:
// "a 2 s total stall").
const fleetStall = 2 * time.Second

// fleetTriggers are the experiment's triggers on timeline tl: the overload
// experiment's slowdown and capacity drop, at tl.before for tl.trigger, and
// its total stall, every worker stopped for fleetStall from tl.before (the
// timeline's trigger span is then part stall, part after it; the stall's
// figure is the overload experiment's: served in the ovlAfter after it).
func fleetTriggers(tl fleetTimeline) []ovlTrigger {
	return []ovlTrigger{
		{name: "slow2.5x", at: tl.before, dur: tl.trigger, slow: 2.5},
		{name: "capacity/2", at: tl.before, dur: tl.trigger, capacity: 0.5},
		{name: "stall2s", at: tl.before, dur: fleetStall, stall: true},
		// not in the default set: an overload that outlasts the callers'
		// deadlines three times over, where a queue at the upstream serves
		// only callers already gone (FLEET_TRIGGERS=slow2.5x-12s)
		{name: "slow2.5x-12s", at: tl.before, dur: 3 * tl.trigger, slow: 2.5},
	}
}

// fleetConfig is the upstream of a trigger and mode over timeline tl.
func fleetConfig(tr ovlTrigger, m ovlMode, tl fleetTimeline) ovlUpstreamConfig {
	cfg := ovlConfig(tr, m)
	cfg.span = tl.runFor() + 2500*time.Millisecond // the last calls' deadlines
	return cfg
}

// fleetCounters are one Handler's counts of its events (Options.OnEvent).
// Every field is only added to.
type fleetCounters struct {
	opened          atomic.Int64 // EventCircuitOpened
	budgetRefused   atomic.Int64 // EventBudgetExceeded: a retry the budget refused
	shed            atomic.Int64 // EventOverloadShed: the overload limiter refused or shed an attempt
	attemptTimeouts atomic.Int64 // EventAttemptTimeout
	attempts        atomic.Int64 // EventAttempt: an attempt sent to the base ended
	retries         atomic.Int64 // EventAttempt with Attempt > 1: a retry that was sent
	circuitRejected atomic.Int64 // EventCircuitRejected
	pushback        atomic.Int64 // EventPushback: an answer that said not to retry (Propagation)
}

// observe counts e.
func (c *fleetCounters) observe(e resilience.Event) {
	switch e.Kind {
	case resilience.EventCircuitOpened:
		c.opened.Add(1)
	case resilience.EventBudgetExceeded:
		c.budgetRefused.Add(1)
	case resilience.EventOverloadShed:
		c.shed.Add(1)
	case resilience.EventAttemptTimeout:
		c.attemptTimeouts.Add(1)
	case resilience.EventCircuitRejected:
		c.circuitRejected.Add(1)
	case resilience.EventPushback:
		c.pushback.Add(1)
	case resilience.EventAttempt:
		c.attempts.Add(1)
		if e.Attempt > 1 {
			c.retries.Add(1)
		}
	}
}

// fleetTotals are a fleet's counters summed over its Handlers.
type fleetTotals struct {
	handlersOpened  int // Handlers whose circuit opened at least once
	opened          int64
	budgetRefused   int64
	shed            int64
	attemptTimeouts int64
	attempts        int64
	retries         int64
	circuitRejected int64
	pushback        int64
}

// sumFleet adds up the counters of a fleet's Handlers.
func sumFleet(cs []*fleetCounters) fleetTotals {
	var t fleetTotals
	for _, c := range cs {
		if c.opened.Load() > 0 {
			t.handlersOpened++
		}
		t.opened += c.opened.Load()
		t.budgetRefused += c.budgetRefused.Load()
		t.shed += c.shed.Load()
		t.attemptTimeouts += c.attemptTimeouts.Load()
		t.attempts += c.attempts.Load()
		t.retries += c.retries.Load()
		t.circuitRejected += c.circuitRejected.Load()
		t.pushback += c.pushback.Load()
	}
	return t
}

// fleetServerCounters are one upstream's refusals by package server's
// middleware (server.Options.OnEvent), by kind; the kinds without the
// server half leave them at zero.
type fleetServerCounters struct {
	expired      atomic.Int64 // server.EventExpired: a budget spent or under MinBudget
	retryRefused atomic.Int64 // server.EventRetryRefused: a retry over the retried share
	overloaded   atomic.Int64 // server.EventOverloaded: MaxConcurrent reached
	stop         atomic.Int64 // refusals that carried the pushback "do not retry"
}

// observe counts e.
func (c *fleetServerCounters) observe(e server.Event) {
	switch e.Kind {
	case server.EventExpired:
		c.expired.Add(1)
	case server.EventRetryRefused:
		c.retryRefused.Add(1)
	case server.EventOverloaded:
		c.overloaded.Add(1)
	}
	if e.Stop {
		c.stop.Add(1)
	}
}

// fleetServerTotals are an upstream's refusals by the server half, read
// after a run.
type fleetServerTotals struct {
	Expired      int64 `json:"expired"`
	RetryRefused int64 `json:"retry_refused"`
	Overloaded   int64 `json:"overloaded"`
	Stop         int64 `json:"stop"`
}

// all is every refusal.
func (t fleetServerTotals) all() int64 { return t.Expired + t.RetryRefused + t.Overloaded }

func (c *fleetServerCounters) totals() fleetServerTotals {
	return fleetServerTotals{Expired: c.expired.Load(), RetryRefused: c.retryRefused.Load(), Overloaded: c.overloaded.Load(), Stop: c.stop.Load()}
}

// A fleetKind is a column: how one replica's client is built over base
// (the replica's own transport under the experiment's base). counters is
// the replica's own; kinds without a Handler leave it at zero.
type fleetKind struct {
	name    string
	doc     string
	handler bool // it counts its Handler's events
	// alone: it runs in a run of its own, right after the others, on the
	// same arrivals: a fleet that holds thousands of dead requests and
	// opens a connection per attempt timed out slows the process, and
	// with it the kinds beside it
	alone bool
	new   func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error)
	// server, if not nil, is the middleware in front of the kind's
	// upstream (the server half of the deadline contract), counting its
	// refusals in counters
	server func(upstream http.Handler, counters *fleetServerCounters) (http.Handler, error)
}

// fleetServerOptions are the server half's options in the fleet's
// `resilience+server` kind: package server's defaults, not scaled (the
// chain experiment's choice): MinBudget 5ms, RetryShare 0.1 over a Window
// of 1s (320 requests at the fleet's load, well over the 20 it needs),
// no MaxConcurrent. Time is scaled in the clients (attempt 200ms, total
// 2s), but the window is a sample, not a wait, and 5ms is under every
// budget but a spent one.
func fleetServerOptions(counters *fleetServerCounters) server.Options {
	return server.Options{OnEvent: counters.observe}
}

// fleetHandler is the fleet's Handler for one replica: dnhOptions (the
// defaults, scaled) with OnEvent counting, and change applied.
func fleetHandler(base http.RoundTripper, counters *fleetCounters, change func(*resilience.Options)) (*http.Client, error) {
	o := dnhOptions()
	o.OnEvent = counters.observe
	if change != nil {
		change(&o)
	}
	t, err := resilience.NewTransport(base, o)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// fleetKinds are the columns, all run at once but those marked alone. The
// handler is the overload experiment's `resilience` client (dnhOptions: the
// defaults as they ship, scaled), with OnEvent counting.
//
// go-retryablehttp runs alone because beside the others it changed their
// results: at N = 1, slow2.5x, seed 1, its upstream held 15,049 requests
// and bare's, beside it, 1,302 (bare served 94% during the trigger, 3%
// after it, never recovered), where bare and the handler without it held
// 672 and 27 and served 99%, recovering at once.
var fleetKinds = []fleetKind{
	{name: "bare", doc: "http.Client, Timeout 2s, no retries", new: func(base http.RoundTripper, _ *fleetCounters) (*http.Client, error) {
		return faultPeerByName("bare").new(base, new(atomic.Int64))
	}},
	{name: "retryablehttp", doc: "go-retryablehttp, 4 attempts, waits 20-200ms, 200ms per attempt, 2s in all (the faults experiment's); in a run of its own, after the others (FLEET_KINDS adds it)", alone: true, new: func(base http.RoundTripper, _ *fleetCounters) (*http.Client, error) {
		return faultPeerByName("retryablehttp").new(base, new(atomic.Int64))
	}},
	{name: "resilience", doc: "the handler's defaults, scaled (dnhOptions: AttemptTimeout 200ms, TotalTimeout 2s, Overload.MaxQueueWait 2s), one Handler per replica", handler: true, new: func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error) {
		return fleetHandler(base, counters, nil)
	}},
	{name: "resilience+server", doc: "the fleet set-up of the deadline contract: the same Handlers with Propagation on (each attempt carries its budget and number in Request-Budget-Ms and Request-Attempt; a pushback is honoured), and their upstream behind server.New with package server's defaults (server.Options{}: MinBudget 5ms, RetryShare 0.1 over a 1s Window, no MaxConcurrent), which sees the whole fleet's budgets and retries; the aware upstream also drops, with a 503, a request whose budget ran out while it was queued, the oblivious one serves it", handler: true, new: func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error) {
		return fleetHandler(base, counters, func(o *resilience.Options) { o.Propagation.Enabled = true })
	}, server: func(upstream http.Handler, counters *fleetServerCounters) (http.Handler, error) {
		return server.New(upstream, fleetServerOptions(counters))
	}},
	{name: "resilience (no retries)", doc: "the handler's defaults, scaled, with Retry.Disabled: what the rest of the handler does, without what its retries do", handler: true, new: func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error) {
		return fleetHandler(base, counters, func(o *resilience.Options) { o.Retry.Disabled = true })
	}},
	{name: "resilience (no cap)", doc: "the handler's defaults, scaled, with the limiter's bounds out of reach (Overload.MinLimit and InitialLimit 1000, the floor of both the latency limit and the loss cap): what the rest of the limiter (retries shed while the upstream is sluggish) and the handler do with no bound on attempts in flight", handler: true, new: func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error) {
		return fleetHandler(base, counters, func(o *resilience.Options) { o.Overload.MinLimit, o.Overload.InitialLimit = 1000, 1000 })
	}},
	{name: "resilience (limiter off)", doc: "the handler's defaults, scaled, with Overload.Disabled (issue 19's limiter off), one Handler per replica", handler: true, new: func(base http.RoundTripper, counters *fleetCounters) (*http.Client, error) {
		return fleetHandler(base, counters, func(o *resilience.Options) { o.Overload.Disabled = true })
	}},
}

// fleetGauge counts a fleet's attempts in flight at its bases (sent, no
// headers or error yet) and keeps the peak.
type fleetGauge struct{ cur, peak atomic.Int64 }

func (g *fleetGauge) up() {
	n := g.cur.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// fleetBase is the innermost layer of every replica, around the
// experiment's base (ovlBase): it counts the attempt in flight until its
// round trip returns.
type fleetBase struct {
	next  http.RoundTripper
	gauge *fleetGauge
}

func (b fleetBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.gauge.up()
	defer b.gauge.cur.Add(-1)
	return b.next.RoundTrip(req)
}

// fleetOutcome is how one call ended, as its caller sees it.
type fleetOutcome uint8

const (
	fleetPending     fleetOutcome = iota // not ended: a harness bug if left after a run
	fleetOK                              // 200, body read in full
	fleetTimeout                         // a timeout: the caller's deadline, the total or the attempt timeout
	fleetOverloaded                      // resilience.ErrOverloaded
	fleetCircuitOpen                     // resilience.ErrCircuitOpen
	fleetStatus                          // an answer other than 200
	fleetOther                           // any other error
	fleetOutcomes                        // how many there are
)

// fleetClassify names the failure err.
func fleetClassify(err error) fleetOutcome {
	var ne net.Error
	switch {
	case errors.Is(err, resilience.ErrOverloaded):
		return fleetOverloaded
	case errors.Is(err, resilience.ErrCircuitOpen):
		return fleetCircuitOpen
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fleetTimeout
	}
	return fleetOther
}

// fleetDo makes one call as ovlDo does (GET, the caller's 2 s deadline,
// body read to EOF) and says how it ended.
func fleetDo(c *http.Client, url string) fleetOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), ovlCallerDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fleetOther
	}
	resp, err := c.Do(req)
	if err != nil {
		return fleetClassify(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return fleetClassify(err)
	case resp.StatusCode != http.StatusOK:
		return fleetStatus
	}
	return fleetOK
}

// fleetSide is one kind's fleet in one run.
type fleetSide struct {
	kind     string
	calls    []ovlCall
	outcomes []fleetOutcome
	up       ovlUpRecord
	sent     int64 // attempts the bases sent (ovlBase's count)
	peakIn   int64 // most attempts in flight at the bases at once
	totals   fleetTotals
	perCli   []fleetTotals     // each replica's, for the consistency check
	behind   bool              // its upstream was behind the server half
	server   fleetServerTotals // the server half's refusals (behind only)
}

// fleetRun is one (N, trigger, mode, seed).
type fleetRun struct {
	n              int
	trigger, mode  string
	seed           uint64
	tl             fleetTimeline
	cfg            ovlUpstreamConfig
	sides          []fleetSide
	lagP99, lagMax time.Duration // how late calls started, against the schedule
	cpu            float64       // process CPU time / wall time, in cores
	wall           time.Duration
}

// fleetAssign gives each of k arrivals a replica in [0, n), uniformly at
// random, from a generator seeded with seed.
func fleetAssign(seed uint64, k, n int) []int {
	rng := rand.New(rand.NewPCG(seed, 0xf1ee7))
	out := make([]int, k)
	for i := range out {
		out[i] = rng.IntN(n)
	}
	return out
}

// fleetMember is one side's machinery during a run.
type fleetMember struct {
	kind       fleetKind
	up         *ovlUpstream
	reg        *ovlRegistry
	gauge      *fleetGauge
	clients    []*http.Client
	transports []*http.Transport
	counters   []*fleetCounters
	srv        *fleetServerCounters // the server half's refusals
}

// close ends a member's fleet: idle connections, then the upstream.
func (m *fleetMember) close() {
	for _, c := range m.clients {
		c.CloseIdleConnections()
	}
	for _, t := range m.transports {
		t.CloseIdleConnections()
	}
	m.up.Close()
}

// runFleet plays seed's arrivals over timeline tl through n replicas of
// every kind at once, each kind against its own upstream of cfg, and
// records.
func runFleet(tb testing.TB, kinds []fleetKind, n int, cfg ovlUpstreamConfig, seed uint64, tl fleetTimeline) fleetRun {
	tb.Helper()
	return runFleetWith(tb, kinds, n, cfg, seed, tl, fleetRunOpts{rate: ovlLoad * ovlCapacity})
}

// fleetRunOpts are what a run of the fleet's machinery may change beyond
// the fleet experiment's own (the no-harm probes, fleet_noharm_test.go).
type fleetRunOpts struct {
	rate float64 // open-loop arrivals per second
	// during, if not nil, runs in a goroutine of its own from time zero
	// until the last call was started (then stop is closed), with each
	// kind's replicas' clients in kinds' order; the run waits for it
	during func(stop <-chan struct{}, clients [][]*http.Client)
}

// runFleetWith is runFleet with the arrivals' rate and a concurrent action
// of o.
func runFleetWith(tb testing.TB, kinds []fleetKind, n int, cfg ovlUpstreamConfig, seed uint64, tl fleetTimeline, o fleetRunOpts) fleetRun {
	tb.Helper()
	members := make([]*fleetMember, len(kinds))
	ran := false
	defer func() { // a constructor failed: close what was started
		if ran {
			return
		}
		for _, m := range members {
			if m != nil {
				m.close()
			}
		}
	}()
	for i, k := range kinds {
		m := &fleetMember{kind: k, reg: newOVLRegistry(), gauge: new(fleetGauge), srv: new(fleetServerCounters)}
		var wrap func(http.Handler) http.Handler
		var werr error
		if k.server != nil {
			wrap = func(up http.Handler) http.Handler {
				h, err := k.server(up, m.srv)
				if err != nil {
					werr = err
					return up
				}
				return h
			}
		}
		m.up = newOVLUpstreamBehind(cfg, m.reg, wrap)
		members[i] = m
		if werr != nil {
			tb.Fatalf("%s: the server half: %v", k.name, werr)
		}
		for range n {
			tr := m.up.clientTransport()
			cs := new(fleetCounters)
			c, err := k.new(fleetBase{next: ovlBase{base: tr, reg: m.reg}, gauge: m.gauge}, cs)
			if err != nil {
				tb.Fatalf("%s: %v", k.name, err)
			}
			m.clients = append(m.clients, c)
			m.transports = append(m.transports, tr)
			m.counters = append(m.counters, cs)
		}
	}
	arrivals := ovlArrivals(seed, o.rate, tl.runFor())
	assign := fleetAssign(seed, len(arrivals), n)
	run := fleetRun{n: n, trigger: cfg.trigger.name, mode: cfg.modeName(), seed: seed, tl: tl, cfg: cfg}
	run.sides = make([]fleetSide, len(kinds))
	urls := make([]string, len(kinds))
	for i, m := range members {
		run.sides[i] = fleetSide{kind: m.kind.name, calls: make([]ovlCall, len(arrivals)), outcomes: make([]fleetOutcome, len(arrivals))}
		urls[i] = m.up.URL() + "/items"
	}
	lags := make([]time.Duration, len(arrivals))
	cpu0 := ovlCPUTime()
	t0 := time.Now()
	for _, m := range members {
		m.up.begin(t0)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	if o.during != nil {
		clients := make([][]*http.Client, len(members))
		for i, m := range members {
			clients[i] = m.clients
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.during(stop, clients)
		}()
	}
	for k, at := range arrivals {
		if d := time.Until(t0.Add(at)); d > 0 {
			time.Sleep(d)
		}
		lags[k] = time.Since(t0) - at
		for i, m := range members {
			c, side := m.clients[assign[k]], &run.sides[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Since(t0)
				o := fleetDo(c, urls[i])
				side.calls[k] = ovlCall{start: start, end: time.Since(t0), ok: o == fleetOK}
				side.outcomes[k] = o
			}()
		}
	}
	close(stop)
	wg.Wait()
	ran = true
	run.wall = time.Since(t0)
	run.cpu = (ovlCPUTime() - cpu0).Seconds() / run.wall.Seconds()
	for i, m := range members {
		m.close()
		s := &run.sides[i]
		s.up = m.up.record()
		s.sent = m.reg.sent.Load()
		s.peakIn = m.gauge.peak.Load()
		s.totals = sumFleet(m.counters)
		s.behind, s.server = m.kind.server != nil, m.srv.totals()
		for _, c := range m.counters {
			s.perCli = append(s.perCli, sumFleet([]*fleetCounters{c}))
		}
	}
	slices.Sort(lags)
	if k := len(lags); k > 0 {
		run.lagP99, run.lagMax = lags[k*99/100], lags[k-1]
	}
	return run
}

// fleetEnvList is the comma-separated env variable name's values, or def.
func fleetEnvList(name, def string) []string {
	s := os.Getenv(name)
	if s == "" {
		s = def
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// fleetParams are BenchmarkFleet's choices, from the environment.
type fleetParams struct {
	ns       []int
	seeds    []uint64
	triggers []ovlTrigger
	modes    []ovlMode
	kinds    []fleetKind
	tl       fleetTimeline
	out      string
}

func fleetParamsFromEnv(tb testing.TB) fleetParams {
	tb.Helper()
	p := fleetParams{tl: fleetFull, out: "fleet"}
	if os.Getenv("FLEET_QUICK") == "1" {
		p.tl = fleetQuick
	}
	for _, f := range fleetEnvList("FLEET_N", "1,10,50,200") {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			tb.Fatalf("FLEET_N: %q is not a fleet size", f)
		}
		p.ns = append(p.ns, v)
	}
	for _, f := range fleetEnvList("FLEET_SEEDS", "1,2,3") {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			tb.Fatalf("FLEET_SEEDS: %v", err)
		}
		p.seeds = append(p.seeds, v)
	}
	names := fleetEnvList("FLEET_TRIGGERS", "slow2.5x,capacity/2,stall2s")
	for _, tr := range fleetTriggers(p.tl) {
		if slices.Contains(names, tr.name) {
			p.triggers = append(p.triggers, tr)
		}
	}
	modes := fleetEnvList("FLEET_MODES", "oblivious")
	for _, m := range ovlModes {
		if slices.Contains(modes, m.name) {
			p.modes = append(p.modes, m)
		}
	}
	kinds := fleetEnvList("FLEET_KINDS", "bare,resilience,resilience+server")
	for _, k := range fleetKinds {
		if slices.Contains(kinds, k.name) {
			p.kinds = append(p.kinds, k)
		}
	}
	if s := os.Getenv("FLEET_OUT"); s != "" {
		p.out = s
	}
	if len(p.triggers) == 0 || len(p.modes) == 0 || len(p.kinds) == 0 {
		tb.Fatalf("FLEET_TRIGGERS, FLEET_MODES or FLEET_KINDS selects nothing")
	}
	return p
}

// BenchmarkFleet runs the fleet experiment once, whatever b.N (run it with
// -benchtime 1x): for every trigger, N, mode and seed, one run of the
// kinds chosen (bare, the handler, and the handler with the server half by
// default) at once, then one of each kind that runs alone; it writes
// results/fleet.md and the rows it is made of, results/fleet.json
// (FLEET_OUT=name: results/name.md and .json; BenchmarkFleetMerge reports
// several as one). A run lasts about 22 s (fleetFull's 20 s of arrivals,
// then the last calls' deadlines): 4 N × 3 triggers × 3 seeds is about 14
// minutes, so split it (FLEET_TRIGGERS, FLEET_MODES, FLEET_N, FLEET_SEEDS).
// FLEET_N=10,200, FLEET_SEEDS=1,2, FLEET_TRIGGERS=slow2.5x,stall2s,
// FLEET_MODES=oblivious,aware and FLEET_KINDS=bare,retryablehttp,resilience
// choose (go-retryablehttp doubles the time); FLEET_QUICK=1 shortens each
// run to 10 s of arrivals (2 s, 4 s, 4 s).
func BenchmarkFleet(b *testing.B) {
	p := fleetParamsFromEnv(b)
	la0 := ovlLoadAvg()
	start := time.Now()
	var runs []fleetRun
	for _, tr := range p.triggers {
		for _, n := range p.ns {
			for _, m := range p.modes {
				for _, seed := range p.seeds {
					for _, kinds := range fleetGroups(p.kinds) {
						r := runFleet(b, kinds, n, fleetConfig(tr, m, p.tl), seed, p.tl)
						runs = append(runs, r)
						fleetLog(r)
					}
				}
			}
		}
	}
	wall := time.Since(start)
	md, err := fleetWriteResults(p.out, fleetResultsOf(p, runs, wall, la0, ovlLoadAvg()))
	if err != nil {
		b.Fatal(err)
	}
	fmt.Print(md)
	b.ReportMetric(float64(wall.Nanoseconds())/float64(b.N), "ns/op")
}

// fleetGroups splits kinds into runs: those that run together, then each
// that runs alone.
func fleetGroups(kinds []fleetKind) [][]fleetKind {
	var together []fleetKind
	var groups [][]fleetKind
	for _, k := range kinds {
		if k.alone {
			groups = append(groups, []fleetKind{k})
		} else {
			together = append(together, k)
		}
	}
	if len(together) > 0 {
		groups = append([][]fleetKind{together}, groups...)
	}
	return groups
}

// fleetLog writes a line per side of r to stderr, as the run ends.
func fleetLog(r fleetRun) {
	for _, s := range r.sides {
		f := fleetSummarize(r, s)
		fmt.Fprintf(os.Stderr, "fleet %-10s N=%-3d %-9s seed %d %-13s trigger %5.1f%%  after4s %5.1f%%  after %5.1f%%  recovery %-6s  wasted %4.1f%%  in flight %4d / held %5d  att/call %4.2f  opened %d/%d  budget %d  shed %d  attTO %d  retries %d  cpu %.2f  lag p99 %v\n",
			r.trigger, r.n, r.mode, r.seed, s.kind, f.trigPct, f.after4Pct, f.afterPct, fleetFmtRecovery(f.recovery), f.wastedPct, s.peakIn, s.up.peakHeld, f.perCall,
			s.totals.handlersOpened, r.n, s.totals.budgetRefused, s.totals.shed, s.totals.attemptTimeouts, s.totals.retries, r.cpu, r.lagP99.Round(time.Millisecond))
	}
}

// TestFleetSmoke checks the harness, not the clients: a fleet of 3 of
// every kind for 2 s of arrivals with a short slowdown in it, against the
// oblivious and the aware upstream at once. Every call ends and is counted
// once as served or failed; the upstream's counts add up to what the bases
// sent, less what the server half refused; each Handler's counters are
// non-negative and the fleet's are their sums; the Handlers' attempts are
// the attempts their bases sent; only the kind behind the server half has
// server refusals; nothing is left running. It asserts nothing about which
// kind does better, and nothing about time.
func TestFleetSmoke(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the parallel subtests
	for _, m := range ovlModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			fleetSmoke(t, m)
		})
	}
}

// fleetSmoke is TestFleetSmoke against an upstream of mode m.
func fleetSmoke(t *testing.T, m ovlMode) {
	aware := m.aware
	tl := fleetTimeline{before: 500 * time.Millisecond, trigger: 500 * time.Millisecond, after: time.Second}
	tr := fleetTriggers(tl)[0]
	const n = 3
	r := runFleet(t, fleetKinds, n, fleetConfig(tr, m, tl), 1, tl)
	require.Len(t, r.sides, len(fleetKinds))
	res := fleetResultsOf(fleetParams{tl: tl}, []fleetRun{r}, time.Second, "", "")
	require.Len(t, res.Rows, len(fleetKinds), "a row per side")
	md, err := fleetMarkdown([]fleetResults{res})
	require.NoError(t, err)
	for _, k := range fleetKinds {
		assert.Contains(t, md, "| "+k.name+" |", "the report has every kind")
	}
	arrivals := len(ovlArrivals(1, ovlLoad*ovlCapacity, tl.runFor()))
	require.Positive(t, arrivals)
	for _, s := range r.sides {
		t.Run(s.kind, func(t *testing.T) {
			require.Len(t, s.calls, arrivals, "one call per arrival")
			var byOutcome [fleetOutcomes]int
			for i, o := range s.outcomes {
				byOutcome[o]++
				assert.Equal(t, o == fleetOK, s.calls[i].ok, "a call is served iff its outcome is ok")
				assert.GreaterOrEqual(t, s.calls[i].end, s.calls[i].start)
			}
			assert.Zero(t, byOutcome[fleetPending], "every call ended")
			failed := 0
			for o := fleetTimeout; o < fleetOutcomes; o++ {
				failed += byOutcome[o]
			}
			assert.Equal(t, arrivals, byOutcome[fleetOK]+failed, "served + failed = calls")

			up := s.up.totals
			assert.LessOrEqual(t, int64(up.arrivals)+s.server.all(), s.sent, "the upstream and its server half received only what the bases sent")
			for _, v := range []int64{s.server.Expired, s.server.RetryRefused, s.server.Overloaded, s.server.Stop} {
				assert.GreaterOrEqual(t, v, int64(0))
			}
			assert.LessOrEqual(t, s.server.Stop, s.server.all(), "a pushback is written on a refusal")
			if !s.behind {
				assert.Equal(t, fleetServerTotals{}, s.server, "no server half, no refusals by it")
			}
			if !aware {
				assert.Zero(t, up.dropped, "the oblivious upstream drops nothing")
			}
			assert.Equal(t, up.arrivals, up.completions+up.dropped+s.up.unserved, "arrivals = completions + dropped + unserved")
			assert.GreaterOrEqual(t, s.up.served200, byOutcome[fleetOK], "every call served had a 200 written")
			assert.LessOrEqual(t, s.peakIn, s.sent)
			if s.sent > 0 {
				assert.Positive(t, s.peakIn)
			}
			if up.arrivals > 0 {
				assert.Positive(t, s.up.peakHeld)
			}

			require.Len(t, s.perCli, n)
			var sum fleetTotals
			for _, c := range s.perCli {
				for _, v := range []int64{c.opened, c.budgetRefused, c.shed, c.attemptTimeouts, c.attempts, c.retries, c.circuitRejected, c.pushback} {
					assert.GreaterOrEqual(t, v, int64(0))
				}
				assert.LessOrEqual(t, c.retries, c.attempts, "a retry sent is an attempt")
				sum.handlersOpened += c.handlersOpened
				sum.opened += c.opened
				sum.budgetRefused += c.budgetRefused
				sum.shed += c.shed
				sum.attemptTimeouts += c.attemptTimeouts
				sum.attempts += c.attempts
				sum.retries += c.retries
				sum.circuitRejected += c.circuitRejected
				sum.pushback += c.pushback
			}
			assert.Equal(t, sum, s.totals, "the fleet's counters are the sums of its Handlers'")
			assert.LessOrEqual(t, s.totals.handlersOpened, n)
			if !slices.ContainsFunc(fleetKinds, func(k fleetKind) bool { return k.name == s.kind && k.handler }) {
				assert.Equal(t, fleetTotals{}, s.totals, "no Handler, no events")
				return
			}
			// Counted per attempt at both ends: every attempt a Handler
			// reports was sent by its base, and only those.
			assert.Equal(t, s.sent, s.totals.attempts, "EventAttempts = attempts the bases sent")
			assert.LessOrEqual(t, s.totals.attempts-s.totals.retries, int64(arrivals), "at most one first attempt per call")
			assert.LessOrEqual(t, s.totals.attemptTimeouts, s.totals.attempts)
			assert.GreaterOrEqual(t, s.totals.shed, int64(byOutcome[fleetOverloaded]), "every call refused as overloaded had its refusal reported")
			assert.LessOrEqual(t, s.totals.pushback, s.totals.attempts, "a pushback answers an attempt")
			if !s.behind {
				assert.Zero(t, s.totals.pushback, "no server half, no pushback")
			}
			f := fleetSummarize(r, s)
			assert.GreaterOrEqual(t, f.wastedPct, 0.0)
			assert.LessOrEqual(t, f.wastedPct, 100.0)
		})
	}
}

// TestFleetStallSummary checks the stall's figure and target on made-up
// calls: a 2 s stall from 4 s in which nothing ends, 100 calls per second,
// and in the 4 s after it every other call served for one side and all for
// the other.
func TestFleetStallSummary(t *testing.T) {
	tl := fleetTimeline{before: 4 * time.Second, trigger: 4 * time.Second, after: 4 * time.Second}
	tr := fleetTriggers(tl)[2]
	require.True(t, tr.stall)
	r := fleetRun{tl: tl, cfg: fleetConfig(tr, ovlModes[0], tl)}
	side := func(everyOther bool) fleetSide {
		s := fleetSide{up: ovlUpRecord{win: make([]ovlUpWindow, int(r.cfg.span/ovlWindow))}}
		for k := range 1200 { // 100 per second for 12 s, each 10 ms long
			at := time.Duration(k) * 10 * time.Millisecond
			ok := !(at >= tr.at && at < tr.at+tr.dur) && !(everyOther && k%2 == 1)
			s.calls = append(s.calls, ovlCall{start: at, end: at + 10*time.Millisecond, ok: ok})
			o := fleetOK
			if !ok {
				o = fleetTimeout
			}
			s.outcomes = append(s.outcomes, o)
		}
		return s
	}
	all, half := fleetSummarize(r, side(false)), fleetSummarize(r, side(true))
	assert.True(t, math.IsNaN(all.trigPct), "a stall has no capacity to serve a share of")
	assert.InDelta(t, 100, all.after4Pct, 0.5, "400 offered, 400 served in the 4 s after the stall")
	assert.InDelta(t, 50, half.after4Pct, 0.5)
	assert.True(t, fleetStallMet(all.after4Pct, all.after4Pct-fleetStallMargin))
	assert.False(t, fleetStallMet(all.after4Pct, half.after4Pct))
	assert.False(t, fleetStallMet(math.NaN(), all.after4Pct), "no figure, no verdict")
}
