package bench

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// The overload experiment's report: per run a summary (summarize), then
// medians over the seeds in markdown tables, and per trigger and mode an
// SVG timeline of the per-window medians.

// ovlRecoveryWindow, ovlRecoveryRun and ovlRecoveryShare define recovery:
// three consecutive 500 ms windows, from the end of the trigger, in which
// ≥ 95% of the calls started succeeded.
const (
	ovlRecoveryWindow = 500 * time.Millisecond
	ovlRecoveryRun    = 3
	ovlRecoveryShare  = 0.95
	ovlAfter          = 4 * time.Second // the "after the trigger" column
)

// ovlSummary is one run in figures.
type ovlSummary struct {
	trigPct   float64 // goodput during the trigger, % of min(offered, capacity); NaN if that is 0
	afterPct  float64 // goodput in the ovlAfter after it, % of min(offered, C)
	recovery  float64 // seconds from the trigger's end; +Inf: not within the run
	perCall   float64 // attempts reaching the upstream / calls
	wastedPct float64 // % of busy time from the trigger to the end, on attempts given up
	okPct     float64 // % of calls that succeeded
	steadyPct float64 // % of the calls started in [1 s, trigger) that succeeded: the cost where nothing is wrong
	peakQueue float64
	cpu       float64 // cores
	lagMs     float64 // p99 start lateness
}

func ovlSummarize(r ovlRun) ovlSummary {
	tr := r.cfg.trigger
	from, to := tr.at, tr.at+tr.dur
	okIn := func(a, b time.Duration) (ok int) {
		for _, c := range r.calls {
			if c.ok && c.end >= a && c.end < b {
				ok++
			}
		}
		return ok
	}
	startedIn := func(a, b time.Duration) (n, ok int) {
		for _, c := range r.calls {
			if c.start >= a && c.start < b {
				n++
				if c.ok {
					ok++
				}
			}
		}
		return n, ok
	}
	s := ovlSummary{trigPct: math.NaN(), afterPct: math.NaN(), recovery: math.Inf(1), peakQueue: float64(r.up.peakQueue), cpu: r.cpu,
		lagMs: float64(r.lagP99.Microseconds()) / 1000}
	if tr.dur > 0 {
		offered, _ := startedIn(from, to)
		limit := min(float64(offered), r.cfg.capacityAt(from)*tr.dur.Seconds())
		if limit > 0 {
			s.trigPct = 100 * float64(okIn(from, to)) / limit
		}
	}
	runEnd := ovlRunFor
	if n := len(r.calls); n > 0 {
		runEnd = min(runEnd, r.calls[n-1].start.Truncate(ovlWindow)+ovlWindow)
	}
	if to+ovlAfter <= runEnd {
		offered, _ := startedIn(to, to+ovlAfter)
		if limit := min(float64(offered), ovlCapacity*ovlAfter.Seconds()); limit > 0 {
			s.afterPct = 100 * float64(okIn(to, to+ovlAfter)) / limit
		}
	}
	pass := func(k int) bool {
		n, ok := startedIn(to+time.Duration(k)*ovlRecoveryWindow, to+time.Duration(k+1)*ovlRecoveryWindow)
		return n > 0 && float64(ok) >= ovlRecoveryShare*float64(n)
	}
	for k := 0; to+time.Duration(k+ovlRecoveryRun)*ovlRecoveryWindow <= runEnd; k++ {
		all := true
		for j := range ovlRecoveryRun {
			if !pass(k + j) {
				all = false
				break
			}
		}
		if all {
			s.recovery = (time.Duration(k) * ovlRecoveryWindow).Seconds()
			break
		}
	}
	steadyTo := from
	if tr.dur == 0 {
		steadyTo = runEnd
	}
	if n, ok := startedIn(time.Second, steadyTo); n > 0 {
		s.steadyPct = 100 * float64(ok) / float64(n)
	}
	ok := 0
	for _, c := range r.calls {
		if c.ok {
			ok++
		}
	}
	if n := len(r.calls); n > 0 {
		s.okPct = 100 * float64(ok) / float64(n)
		s.perCall = float64(r.up.totals.arrivals) / float64(n)
	}
	var busy, wasted time.Duration
	for i, w := range r.up.win {
		if t := time.Duration(i) * ovlWindow; t >= from && t < runEnd {
			busy += w.busy
			wasted += w.wasted
		}
	}
	if busy > 0 {
		s.wastedPct = 100 * float64(wasted) / float64(busy)
	}
	return s
}

// ovlSeries are a run's timelines, one value per ovlWindow over ovlRunFor.
type ovlSeries struct{ goodput, attempts, queue, wasted []float64 }

func ovlSeriesOf(r ovlRun) ovlSeries {
	n := int(ovlRunFor / ovlWindow)
	s := ovlSeries{make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)}
	per := ovlWindow.Seconds()
	for _, c := range r.calls {
		if i := int(c.end / ovlWindow); c.ok && i < n {
			s.goodput[i] += 1 / per
		}
	}
	for i := 0; i < n && i < len(r.up.win); i++ {
		w := r.up.win[i]
		s.attempts[i] = float64(w.arrivals) / per
		s.queue[i] = w.queue()
		if w.busy > 0 {
			s.wasted[i] = 100 * float64(w.wasted) / float64(w.busy)
		}
	}
	return s
}

type ovlKey struct{ trigger, mode, client string }

type ovlReport struct {
	clients       []ovlClient
	triggers      []ovlTrigger
	modes         []ovlMode
	seeds         []uint64
	med           map[ovlKey]ovlSummary
	timeline      map[ovlKey]ovlSeries // per-window medians
	wall          time.Duration
	loadBefore    string
	loadAfter     string
	cpuMax, lagMx float64
	out           string // file name prefix of the SVGs
}

func newOVLReport(clients []ovlClient, triggers []ovlTrigger, modes []ovlMode, seeds []uint64, runs []ovlRun, wall time.Duration, la0, la1 string) *ovlReport {
	rep := &ovlReport{clients: clients, triggers: triggers, modes: modes, seeds: seeds, med: map[ovlKey]ovlSummary{},
		timeline: map[ovlKey]ovlSeries{}, wall: wall, loadBefore: la0, loadAfter: la1}
	sums := map[ovlKey][]ovlSummary{}
	ser := map[ovlKey][]ovlSeries{}
	for _, r := range runs {
		k := ovlKey{r.trigger, r.mode, r.client}
		sums[k] = append(sums[k], ovlSummarize(r))
		ser[k] = append(ser[k], ovlSeriesOf(r))
		rep.cpuMax = max(rep.cpuMax, r.cpu)
		rep.lagMx = max(rep.lagMx, float64(r.lagP99.Microseconds())/1000)
	}
	for k, ss := range sums {
		m := func(f func(ovlSummary) float64) float64 {
			v := make([]float64, 0, len(ss))
			for _, s := range ss {
				if x := f(s); !math.IsNaN(x) {
					v = append(v, x)
				}
			}
			if len(v) == 0 {
				return math.NaN()
			}
			return ovlMedianInf(v)
		}
		rep.med[k] = ovlSummary{
			trigPct:   m(func(s ovlSummary) float64 { return s.trigPct }),
			afterPct:  m(func(s ovlSummary) float64 { return s.afterPct }),
			recovery:  m(func(s ovlSummary) float64 { return s.recovery }),
			perCall:   m(func(s ovlSummary) float64 { return s.perCall }),
			wastedPct: m(func(s ovlSummary) float64 { return s.wastedPct }),
			okPct:     m(func(s ovlSummary) float64 { return s.okPct }),
			steadyPct: m(func(s ovlSummary) float64 { return s.steadyPct }),
			peakQueue: m(func(s ovlSummary) float64 { return s.peakQueue }),
			cpu:       m(func(s ovlSummary) float64 { return s.cpu }),
			lagMs:     m(func(s ovlSummary) float64 { return s.lagMs }),
		}
	}
	for k, ss := range ser {
		pick := func(f func(ovlSeries) []float64) []float64 {
			n := len(f(ss[0]))
			out := make([]float64, n)
			for i := range n {
				v := make([]float64, len(ss))
				for j, s := range ss {
					v[j] = f(s)[i]
				}
				out[i] = median(v)
			}
			return out
		}
		rep.timeline[k] = ovlSeries{
			goodput:  pick(func(s ovlSeries) []float64 { return s.goodput }),
			attempts: pick(func(s ovlSeries) []float64 { return s.attempts }),
			queue:    pick(func(s ovlSeries) []float64 { return s.queue }),
			wasted:   pick(func(s ovlSeries) []float64 { return s.wasted }),
		}
	}
	return rep
}

// medianInf is median for values that may be +Inf (the mean of two middle
// values, one infinite, is infinite: "never" wins a tie).
func ovlMedianInf(v []float64) float64 { return median(v) }

func ovlFmtRecovery(s float64) string {
	if math.IsInf(s, 1) {
		return "never"
	}
	return fmt.Sprintf("%.1fs", s)
}

func ovlFmtPct(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.0f", x)
}

func (rep *ovlReport) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	o := dnhOptions()
	p("# Overload: the timeline of a metastable failure (issue 19)\n\n")
	p("Run %s, %s, %d cores, load before %s, after %s; the experiment took %v. "+
		"`go test -run '^$' -bench BenchmarkOverload -benchtime 1x -timeout 90m .` in bench/",
		time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), runtime.NumCPU(), rep.loadBefore, rep.loadAfter, rep.wall.Round(time.Second))
	var env []string
	for _, k := range []string{"OVERLOAD_SEEDS", "OVERLOAD_CLIENTS", "OVERLOAD_TRIGGERS", "OVERLOAD_MODES", "OVERLOAD_OUT"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	if len(env) > 0 {
		p(" with %s", strings.Join(env, " "))
	}
	p(".\n\n")
	p("Upstream: %d workers, service time %v (deterministic), one FIFO queue, nothing shed: C = %.0f calls/s. "+
		"Oblivious mode serves every queued request, aware mode drops those whose caller has gone before serving them. "+
		"Load: open-loop Poisson arrivals at %.0f%% of C (%.0f calls/s) for %v, seeds %s (medians over them, each figure separately); "+
		"every call has a %v deadline. Triggers at %v: %s. "+
		"The handler's options are the do-no-harm experiment's scaled defaults (AttemptTimeout %v, TotalTimeout %v, Retry.Delay %v, "+
		"Retry.MaxDelay %v); retryablehttp and failsafehttp are the faults experiment's (4 attempts, 200ms attempt timeout). "+
		"Where the adaptive peers sit: see overload_peers_test.go.\n\n",
		ovlWorkers, ovlService, ovlCapacity, 100*ovlLoad, ovlLoad*ovlCapacity, ovlRunFor, ovlJoinSeeds(rep.seeds),
		ovlCallerDeadline, ovlTriggerAt, ovlTriggerText(rep.triggers),
		o.AttemptTimeout, o.TotalTimeout, o.Retry.Delay, o.Retry.MaxDelay)
	p("Clients, one after another on the same arrivals:\n\n")
	for _, c := range rep.clients {
		p("- `%s`: %s\n", c.name, c.doc)
	}
	p("\n")
	p("Machine check: the busiest run used %.2f of %d cores (process CPU time / wall time, upstream included); "+
		"the worst p99 lateness of a call's start against its schedule was %.1f ms.\n\n", rep.cpuMax, runtime.NumCPU(), rep.lagMx)
	p("Columns: **trigger %%**: calls served during the trigger as %% of the physical limit min(offered, capacity during the trigger) "+
		"(– for the stall, whose limit is 0); **after %%**: calls served in the %v after it as %% of min(offered, C); "+
		"**recovery**: from the trigger's end to the first of three consecutive 500 ms windows in which ≥ 95%% of the calls started succeeded "+
		"(never: not before the arrivals stop); **attempts/call**: requests the upstream received / calls; "+
		"**wasted %%**: share of the upstream's busy time, from the trigger to the end, spent on attempts whose caller had given up "+
		"by the time their service finished; **before %%**: calls started from 1 s to the trigger that succeeded (the cost where nothing is wrong yet); **ok %%**: calls served over the whole run; **peak queue**: requests waiting; **cpu**: process CPU time / wall time of the run, in cores (client and upstream together); "+
		"**lag p99**: how late the 99th-percentile call started against its Poisson schedule (the machine's doing, not the client's: "+
		"read a row with a large lag with care).\n\n", ovlAfter)
	for _, tr := range rep.triggers {
		p("## %s\n\n", tr.name)
		for _, m := range rep.modes {
			p("### %s upstream\n\n![timeline](%s-%s-%s.svg)\n\n", m.name, rep.out, ovlFileName(tr.name), m.name)
			p("| client | trigger %% | after %% | recovery | attempts/call | wasted %% | before %% | ok %% | peak queue | cpu | lag p99 |\n")
			p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, c := range rep.clients {
				s, ok := rep.med[ovlKey{tr.name, m.name, c.name}]
				if !ok {
					continue
				}
				p("| %s | %s | %s | %s | %.2f | %.0f | %.1f | %.1f | %.0f | %.2f | %.0f ms |\n", c.name, ovlFmtPct(s.trigPct), ovlFmtPct(s.afterPct),
					ovlFmtRecovery(s.recovery), s.perCall, s.wastedPct, s.steadyPct, s.okPct, s.peakQueue, s.cpu, s.lagMs)
			}
			p("\n")
		}
	}
	return b.String()
}

func ovlSeedText(seeds []uint64) string {
	if len(seeds) == 1 {
		return fmt.Sprintf("seed %d", seeds[0])
	}
	return fmt.Sprintf("medians of seeds %s", ovlJoinSeeds(seeds))
}

func ovlJoinSeeds(seeds []uint64) string {
	s := make([]string, len(seeds))
	for i, v := range seeds {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

func ovlTriggerText(trs []ovlTrigger) string {
	var s []string
	for _, tr := range trs {
		switch {
		case tr.stall:
			s = append(s, fmt.Sprintf("%s (every worker stops for %v)", tr.name, tr.dur))
		case tr.slow > 0:
			s = append(s, fmt.Sprintf("%s (service time ×%.1f for %v, no errors)", tr.name, tr.slow, tr.dur))
		case tr.capacity > 0:
			s = append(s, fmt.Sprintf("%s (%.0f%% of the workers for %v)", tr.name, 100*tr.capacity, tr.dur))
		}
	}
	return strings.Join(s, "; ")
}

// ovlColors are the clients' line colours, in ovlClients' order.
var ovlColors = []string{"#000000", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// svg draws one trigger and mode: four panels (goodput, attempts reaching
// the upstream, queue length, wasted share), one polyline per client, the
// trigger shaded. Hand-written SVG, no dependencies.
func (rep *ovlReport) svg(tr ovlTrigger, mode string) string {
	const (
		width, left, right = 980, 70, 210
		panelH, gap, top   = 150, 40, 40
	)
	plotW := float64(width - left - right)
	panels := []struct {
		title string
		unit  string
		get   func(ovlSeries) []float64
		fixed float64 // y max if > 0
		log   bool    // log10(1+v) scale
	}{
		{"goodput (calls served per second)", "calls/s", func(s ovlSeries) []float64 { return s.goodput }, 0, false},
		{"attempts reaching the upstream per second", "attempts/s", func(s ovlSeries) []float64 { return s.attempts }, 0, false},
		{"queue length (time-weighted mean per 250 ms; log scale)", "requests", func(s ovlSeries) []float64 { return s.queue }, 0, true},
		{"share of the upstream's busy time on attempts already given up", "%", func(s ovlSeries) []float64 { return s.wasted }, 100, false},
	}
	height := top + len(panels)*(panelH+gap) + 10
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="14" font-weight="bold">overload: %s, %s upstream (C = %.0f/s, offered %.0f/s; %s)</text>`+"\n",
		left, tr.name, mode, ovlCapacity, ovlLoad*ovlCapacity, ovlSeedText(rep.seeds))
	xs := func(t float64) float64 { return float64(left) + plotW*t/ovlRunFor.Seconds() }
	for pi, pn := range panels {
		y0 := float64(top + pi*(panelH+gap))
		ymax := pn.fixed
		if ymax == 0 {
			for _, c := range rep.clients {
				if s, ok := rep.timeline[ovlKey{tr.name, mode, c.name}]; ok {
					for _, v := range pn.get(s) {
						ymax = max(ymax, v)
					}
				}
			}
			ymax = ovlNiceCeil(ymax)
		}
		ys := func(v float64) float64 { return y0 + float64(panelH) - float64(panelH)*min(v, ymax)/ymax }
		ticks := []float64{0, ymax / 4, ymax / 2, 3 * ymax / 4, ymax}
		if pn.log {
			ymax = max(10, ymax)
			logTop := math.Log10(1 + ymax)
			ys = func(v float64) float64 {
				return y0 + float64(panelH) - float64(panelH)*math.Log10(1+max(0, min(v, ymax)))/logTop
			}
			ticks = []float64{0}
			for t := 1.0; t <= ymax; t *= 10 {
				ticks = append(ticks, t)
			}
		}
		p(`<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-6, pn.title)
		if tr.dur > 0 {
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#f2dede"/>`+"\n",
				xs(tr.at.Seconds()), y0, xs((tr.at+tr.dur).Seconds())-xs(tr.at.Seconds()), panelH)
		}
		p(`<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, plotW, panelH)
		for _, v := range ticks {
			y := ys(v)
			p(`<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, float64(left)+plotW, y)
			p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-4, y+4, ovlTrimFloat(v))
		}
		for t := 0; t <= int(ovlRunFor.Seconds()); t += 2 {
			p(`<text x="%.1f" y="%.1f" text-anchor="middle">%ds</text>`+"\n", xs(float64(t)), y0+float64(panelH)+13, t)
		}
		p(`<text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">%s</text>`+"\n",
			y0+float64(panelH)/2, y0+float64(panelH)/2, pn.unit)
		for ci, c := range rep.clients {
			s, ok := rep.timeline[ovlKey{tr.name, mode, c.name}]
			if !ok {
				continue
			}
			var pts []string
			for i, v := range pn.get(s) {
				t := (float64(i) + 0.5) * ovlWindow.Seconds()
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs(t), ys(v)))
			}
			p(`<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", ovlColors[ci%len(ovlColors)], strings.Join(pts, " "))
		}
	}
	for ci, c := range rep.clients {
		y := top + 10 + ci*18
		x := width - right + 15
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", x, y, x+20, y, ovlColors[ci%len(ovlColors)])
		p(`<text x="%d" y="%d">%s</text>`+"\n", x+25, y+4, c.name)
	}
	p("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func ovlNiceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func ovlTrimFloat(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	return strings.TrimSuffix(s, ".0")
}
