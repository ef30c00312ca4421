package bench

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The fleet experiment's report (issue 31): per kind and run a summary
// (fleetSummarize), a table of ranges over the seeds in the shape,
// and every run in full.

// Recovery, as the fleet experiment reads it: the first 500 ms window
// after the trigger's end from which every window, to the end of the
// arrivals, has ≥ 90% of the calls started in it served. The overload
// experiment's reading (three consecutive windows with ≥ 95%, issue 31's
// own) is reported beside it.
const (
	fleetRecoveryShare = 0.90
)

// fleetSummary is one kind's run in figures.
type fleetSummary struct {
	trigPct     float64 // calls served during the trigger, % of min(offered, capacity during it)
	afterPct    float64 // calls served in the tl.after after it, % of min(offered, C)
	after4Pct   float64 // the overload experiment's: served in the ovlAfter after it, % of min(offered, C)
	recovery    float64 // seconds from the trigger's end (fleetRecoveryShare, to the end); +Inf: never
	recovery95  float64 // the overload experiment's: three windows ≥ 95%; +Inf: never
	steadyPct   float64 // % of the calls started from 1 s to the trigger that were served
	okPct       float64 // % of all calls served
	perCall     float64 // attempts the upstream received / calls
	sentPerCall float64 // attempts the bases sent / calls
	wastedPct   float64 // % of the upstream's busy time from the trigger on, on attempts given up
	outcomes    [fleetOutcomes]int
}

// fleetSummarize computes side's figures in run r.
func fleetSummarize(r fleetRun, s fleetSide) fleetSummary {
	tr := r.cfg.trigger
	from, to, end := tr.at, tr.at+tr.dur, r.tl.runFor()
	okIn := func(a, b time.Duration) (ok int) { // calls served that ended in [a, b)
		for _, c := range s.calls {
			if c.ok && c.end >= a && c.end < b {
				ok++
			}
		}
		return ok
	}
	startedIn := func(a, b time.Duration) (n, ok int) { // calls started in [a, b), and served
		for _, c := range s.calls {
			if c.start >= a && c.start < b {
				n++
				if c.ok {
					ok++
				}
			}
		}
		return n, ok
	}
	f := fleetSummary{trigPct: math.NaN(), afterPct: math.NaN(), after4Pct: math.NaN(), recovery: math.Inf(1), recovery95: math.Inf(1)}
	for _, o := range s.outcomes {
		f.outcomes[o]++
	}
	if tr.dur > 0 {
		offered, _ := startedIn(from, to)
		if limit := min(float64(offered), r.cfg.capacityAt(from)*tr.dur.Seconds()); limit > 0 {
			f.trigPct = 100 * float64(okIn(from, to)) / limit
		}
	}
	if offered, _ := startedIn(to, end); offered > 0 {
		f.afterPct = 100 * float64(okIn(to, end)) / min(float64(offered), ovlCapacity*(end-to).Seconds())
	}
	if to+ovlAfter <= end {
		if offered, _ := startedIn(to, to+ovlAfter); offered > 0 {
			f.after4Pct = 100 * float64(okIn(to, to+ovlAfter)) / min(float64(offered), ovlCapacity*ovlAfter.Seconds())
		}
	}
	var pass95, pass90 []bool // per recovery window from the trigger's end
	for a := to; a+ovlRecoveryWindow <= end; a += ovlRecoveryWindow {
		n, ok := startedIn(a, a+ovlRecoveryWindow)
		pass95 = append(pass95, n > 0 && float64(ok) >= ovlRecoveryShare*float64(n))
		pass90 = append(pass90, n > 0 && float64(ok) >= fleetRecoveryShare*float64(n))
	}
	for k := len(pass90) - 1; k >= 0 && pass90[k]; k-- {
		f.recovery = (time.Duration(k) * ovlRecoveryWindow).Seconds()
	}
	for k := 0; k+ovlRecoveryRun <= len(pass95); k++ {
		if !slices.Contains(pass95[k:k+ovlRecoveryRun], false) {
			f.recovery95 = (time.Duration(k) * ovlRecoveryWindow).Seconds()
			break
		}
	}
	if n, ok := startedIn(time.Second, from); n > 0 {
		f.steadyPct = 100 * float64(ok) / float64(n)
	}
	if n := len(s.calls); n > 0 {
		f.okPct = 100 * float64(f.outcomes[fleetOK]) / float64(n)
		f.perCall = float64(s.up.totals.arrivals) / float64(n)
		f.sentPerCall = float64(s.sent) / float64(n)
	}
	var busy, wasted time.Duration
	for i, w := range s.up.win {
		if t := time.Duration(i) * ovlWindow; t >= from && t < end {
			busy += w.busy
			wasted += w.wasted
		}
	}
	if busy > 0 {
		f.wastedPct = 100 * float64(wasted) / float64(busy)
	}
	return f
}

func fleetFmtRecovery(s float64) string {
	if math.IsInf(s, 1) {
		return "never"
	}
	return fmt.Sprintf("%.1fs", s)
}

// fleetRange is "lo–hi" of vs formatted by f, or one value when they agree;
// NaNs are left out ("–" if nothing is left).
func fleetRange(vs []float64, f func(float64) string) string {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(vs) == 0 {
		return "–"
	}
	lo, hi := f(slices.Min(vs)), f(slices.Max(vs))
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

func fleetInt(v float64) string { return fmt.Sprintf("%.0f", v) }
func fleetDec(v float64) string { return fmt.Sprintf("%.2f", v) }

// fleetReport is a BenchmarkFleet run's report.
type fleetReport struct {
	p                     fleetParams
	runs                  []fleetRun
	wall                  time.Duration
	loadBefore, loadAfter string
}

// fleetCommit names the commit the experiment ran on, and says if bench/'s
// Go files differ from it.
func fleetCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--", ".").Output(); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasSuffix(strings.TrimSpace(l), ".go") {
				return c + " (with uncommitted changes to bench/'s Go files)"
			}
		}
	}
	return c
}

// command is the go test command line that makes this report.
func (rep *fleetReport) command() string {
	var env []string
	for _, k := range []string{"FLEET_N", "FLEET_SEEDS", "FLEET_TRIGGERS", "FLEET_MODES", "FLEET_KINDS", "FLEET_QUICK", "FLEET_OUT"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	env = append(env, "go test -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x -timeout 30m .")
	return strings.Join(env, " ")
}

// side finds kind's side in r.
func (r fleetRun) side(kind string) (fleetSide, bool) {
	for _, s := range r.sides {
		if s.kind == kind {
			return s, true
		}
	}
	return fleetSide{}, false
}

func (rep *fleetReport) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	o := dnhOptions()
	tl := rep.p.tl
	p("# Fleet: N replicas, each its own Handler, one upstream (issue 31)\n\n")
	p("Run %s, %s, commit %s, %d cores, load before %s, after %s; the experiment took %v. In bench/: `%s`.\n\n",
		time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), fleetCommit(), runtime.NumCPU(),
		rep.loadBefore, rep.loadAfter, rep.wall.Round(time.Second), rep.command())
	p("Upstream: the overload experiment's, %d workers × %v, one FIFO queue, nothing shed, C = %.0f calls/s. "+
		"Load: open-loop Poisson arrivals at %.0f%% of C (%.0f calls/s) for %v (%v before the trigger, %v of trigger, %v after), "+
		"each call given to one of N replicas uniformly at random; every call has a %v deadline. "+
		"Every kind runs at the same time as the others, its N replicas (each its own client and its own http.Transport) against its own identical upstream, "+
		"on the same arrivals and the same replica numbers. Triggers: %s.\n\n",
		ovlWorkers, ovlService, ovlCapacity, 100*ovlLoad, ovlLoad*ovlCapacity, tl.runFor(), tl.before, tl.trigger, tl.after,
		ovlCallerDeadline, ovlTriggerText(rep.p.triggers))
	p("Kinds:\n\n")
	for _, k := range rep.p.kinds {
		p("- `%s`: %s\n", k.name, k.doc)
	}
	p("\nThe handler's scaled options: AttemptTimeout %v, TotalTimeout %v, Retry.Delay %v, Retry.MaxDelay %v, CircuitBreaker.SamplingDuration %v, BreakDuration %v, Overload.MaxQueueWait %v; the rest are the defaults.\n\n",
		o.AttemptTimeout, o.TotalTimeout, o.Retry.Delay, o.Retry.MaxDelay, o.CircuitBreaker.SamplingDuration, o.CircuitBreaker.BreakDuration, o.Overload.MaxQueueWait)
	var cpuMax float64
	var lagMax time.Duration
	for _, r := range rep.runs {
		cpuMax = max(cpuMax, r.cpu)
		lagMax = max(lagMax, r.lagP99)
	}
	p("Machine check: the busiest run used %.2f of %d cores (process CPU time / wall time: every kind's clients and upstreams together); "+
		"the worst p99 lateness of a call's start against its schedule was %v.\n\n", cpuMax, runtime.NumCPU(), lagMax.Round(time.Millisecond))
	p("Columns: **trigger %%**: calls served during the trigger as %% of the physical limit min(offered, capacity during it); "+
		"**after 4 s %%** (the stall's figure): calls served in the %v after the trigger as %% of min(offered, C); **after %%**: calls served in the %v after it as %% of min(offered, C); "+
		"**recovery**: from the trigger's end to the first 500 ms window from which every window to the end of the arrivals had ≥ %.0f%% of the calls started in it served "+
		"(never: the last one did not); **recovery 3×95%%**: the overload experiment's (the first of three consecutive windows with ≥ 95%%); "+
		"**opened**: Handlers whose circuit opened at least once, of N; **budget**: retries the retry budget refused (EventBudgetExceeded); "+
		"**shed**: attempts the overload limiter refused or shed (EventOverloadShed), and in brackets calls that failed with ErrOverloaded; "+
		"**attempt timeouts**: EventAttemptTimeout; **retries**: retries sent (EventAttempt with Attempt > 1); "+
		"the counters are summed over the fleet's Handlers (Options.OnEvent). "+
		"**in flight / held**: the most attempts in flight at once at the fleet's bases (sent, no headers yet) against the most requests the upstream held at once (queued + in service); "+
		"**wasted %%**: share of the upstream's busy time, from the trigger to the end of the arrivals, on attempts whose caller had given up by the time their service finished.\n\n",
		ovlAfter, tl.after, 100*fleetRecoveryShare)

	for _, m := range rep.p.modes {
		p("## %s upstream: ranges over seeds %s\n\n", m.name, ovlJoinSeeds(rep.p.seeds))
		p("| trigger | N |")
		for _, k := range rep.p.kinds {
			p(" %s: trigger %% / after %% / recovery |", k.name)
		}
		p(" resilience: circuits opened (Handlers, of N) | budget refusals | shed (calls ErrOverloaded) | attempt timeouts | retries sent | attempts/call | in flight / held | wasted %% |\n")
		p("|---|---:|%s---:|---:|---:|---:|---:|---:|---:|---:|\n", strings.Repeat("---|", len(rep.p.kinds)))
		for _, tr := range rep.p.triggers {
			for _, n := range rep.p.ns {
				var runs []fleetRun
				for _, r := range rep.runs {
					if r.trigger == tr.name && r.n == n && r.mode == m.name {
						runs = append(runs, r)
					}
				}
				if len(runs) == 0 {
					continue
				}
				p("| %s | %d |", tr.name, n)
				col := func(kind string, f func(fleetRun, fleetSide, fleetSummary) float64) []float64 {
					var v []float64
					for _, r := range runs {
						if s, ok := r.side(kind); ok {
							v = append(v, f(r, s, fleetSummarize(r, s)))
						}
					}
					return v
				}
				for _, k := range rep.p.kinds {
					p(" %s / %s / %s |",
						fleetRange(col(k.name, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return f.trigPct }), fleetInt),
						fleetRange(col(k.name, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return f.afterPct }), fleetInt),
						fleetRange(col(k.name, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return f.recovery }), fleetFmtRecovery))
				}
				lib := "resilience"
				if !slices.ContainsFunc(rep.p.kinds, func(k fleetKind) bool { return k.name == lib }) {
					p(" | | | | | | | |\n")
					continue
				}
				tot := func(g func(fleetTotals) int64) []float64 {
					return col(lib, func(_ fleetRun, s fleetSide, _ fleetSummary) float64 { return float64(g(s.totals)) })
				}
				p(" %s | %s | %s (%s) | %s | %s | %s | %s / %s | %s |\n",
					fleetRange(tot(func(t fleetTotals) int64 { return int64(t.handlersOpened) }), fleetInt),
					fleetRange(tot(func(t fleetTotals) int64 { return t.budgetRefused }), fleetInt),
					fleetRange(tot(func(t fleetTotals) int64 { return t.shed }), fleetInt),
					fleetRange(col(lib, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return float64(f.outcomes[fleetOverloaded]) }), fleetInt),
					fleetRange(tot(func(t fleetTotals) int64 { return t.attemptTimeouts }), fleetInt),
					fleetRange(tot(func(t fleetTotals) int64 { return t.retries }), fleetInt),
					fleetRange(col(lib, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return f.perCall }), fleetDec),
					fleetRange(col(lib, func(_ fleetRun, s fleetSide, _ fleetSummary) float64 { return float64(s.peakIn) }), fleetInt),
					fleetRange(col(lib, func(_ fleetRun, s fleetSide, _ fleetSummary) float64 { return float64(s.up.peakHeld) }), fleetInt),
					fleetRange(col(lib, func(_ fleetRun, _ fleetSide, f fleetSummary) float64 { return f.wastedPct }), fleetInt))
			}
		}
		p("\n")
	}

	rep.stallVerdicts(p)
	p("## Every run\n\n")
	p("Calls: offered in the run; **before %%**: calls started from 1 s to the trigger that were served; **sent/call**: attempts the bases sent per call; **arrived/call**: attempts the upstream received per call; " +
		"**failures**: calls that failed, by what the caller saw: timeout / ErrOverloaded / ErrCircuitOpen / a status other than 200 / other.\n\n")
	p("| trigger | mode | N | seed | kind | calls | trigger %% | after 4 s %% | after %% | recovery | recovery 3×95%% | before %% | ok %% | sent/call | arrived/call | wasted %% | in flight / held | opened (events) | budget | shed | attempt timeouts | retries | failures | cpu | lag p99 |\n")
	p("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, r := range rep.runs {
		for _, s := range r.sides {
			f := fleetSummarize(r, s)
			t := s.totals
			p("| %s | %s | %d | %d | %s | %d | %s | %s | %s | %s | %s | %.1f | %.1f | %.2f | %.2f | %.0f | %d / %d | %d (%d) | %d | %d | %d | %d | %d / %d / %d / %d / %d | %.2f | %v |\n",
				r.trigger, r.mode, r.n, r.seed, s.kind, len(s.calls), ovlFmtPct(f.trigPct), ovlFmtPct(f.after4Pct), ovlFmtPct(f.afterPct),
				fleetFmtRecovery(f.recovery), fleetFmtRecovery(f.recovery95), f.steadyPct, f.okPct, f.sentPerCall, f.perCall, f.wastedPct,
				s.peakIn, s.up.peakHeld, t.handlersOpened, t.opened, t.budgetRefused, t.shed, t.attemptTimeouts, t.retries,
				f.outcomes[fleetTimeout], f.outcomes[fleetOverloaded], f.outcomes[fleetCircuitOpen], f.outcomes[fleetStatus], f.outcomes[fleetOther],
				r.cpu, r.lagP99.Round(time.Millisecond))
		}
	}
	return b.String()
}

// fleetStallMargin is issue 31's stall target: the handler's fleet serves,
// in the ovlAfter after the stall, at least bare's figure less this many
// points.
const fleetStallMargin = 2.0

// stallVerdicts writes, for each stall run, the stall target: the
// handler's served % in the ovlAfter after the stall against bare's, run by
// run (a target on a pair of sides of one run, not on ranges). Nothing is
// written without a stall trigger, bare and the handler.
func (rep *fleetReport) stallVerdicts(p func(string, ...any)) {
	var runs []fleetRun
	for _, r := range rep.runs {
		_, okB := r.side("bare")
		_, okR := r.side("resilience")
		if r.cfg.trigger.stall && okB && okR {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	p("## The stall: served in the %v after it (issue 31: resilience ≥ bare − %.0f)\n\n", ovlAfter, fleetStallMargin)
	p("| mode | N | seed | bare: after %v %% | resilience: after %v %% | met |\n|---|---:|---:|---:|---:|---|\n", ovlAfter, ovlAfter)
	met := 0
	for _, r := range runs {
		b, _ := r.side("bare")
		l, _ := r.side("resilience")
		fb, fl := fleetSummarize(r, b).after4Pct, fleetSummarize(r, l).after4Pct
		ok := fleetStallMet(fb, fl)
		if ok {
			met++
		}
		p("| %s | %d | %d | %s | %s | %s |\n", r.mode, r.n, r.seed, ovlFmtPct(fb), ovlFmtPct(fl), fleetYes(ok))
	}
	p("\nMet in %d of %d runs.\n\n", met, len(runs))
}

// fleetStallMet is the stall target on bare's and the handler's served %
// in the ovlAfter after it; a figure that could not be computed fails.
func fleetStallMet(bare, lib float64) bool {
	return !math.IsNaN(bare) && !math.IsNaN(lib) && lib >= bare-fleetStallMargin
}

// fleetYes is a verdict as the reports write it.
func fleetYes(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
