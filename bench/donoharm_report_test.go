package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The do-no-harm experiment's report: medians over the seeds, one markdown
// table per metric (rows scenarios, columns clients) and the verdict on
// issue 9's targets for every resilience variant.

type dnhKey struct{ scenario, client string }

// dnhMedian is one cell of every table: the median over the seeds of each
// metric, taken separately.
type dnhMedian struct {
	success float64 // % of calls with a 200 and the body read
	perCall float64 // upstream attempts / calls
	load    float64 // peak attempts in any 100 ms / calls offered in 100 ms
	opens   float64 // circuit openings
	stale   float64 // % of calls answered stale by the fallback layer
	oldest  float64 // seconds: the oldest stale answer's Age
	limit   float64 // % of calls the run's upstream could serve (dnhScenario.measuredLimit)
	goodput float64 // % of calls served while the load was offered (dnhResult.goodput)
	service float64 // ms: the mean time a request in service held a worker
}

type dnhReport struct {
	clients []dnhClient
	med     map[dnhKey]dnhMedian
	wall    time.Duration
}

func newDNHReport(clients []dnhClient, runs map[dnhKey][]dnhResult, wall time.Duration) *dnhReport {
	r := &dnhReport{clients: clients, med: map[dnhKey]dnhMedian{}, wall: wall}
	for k, rs := range runs {
		m := func(f func(dnhResult) float64) float64 {
			v := make([]float64, len(rs))
			for i, x := range rs {
				v[i] = f(x)
			}
			return median(v)
		}
		r.med[k] = dnhMedian{
			success: m(dnhResult.success),
			perCall: m(dnhResult.perCall),
			load:    m(dnhResult.load),
			opens:   m(func(x dnhResult) float64 { return float64(x.opens) }),
			stale:   m(func(x dnhResult) float64 { return 100 * float64(x.stale) / float64(x.calls) }),
			oldest:  m(func(x dnhResult) float64 { return x.oldest.Seconds() }),
			limit:   m(func(x dnhResult) float64 { return x.limit }),
			goodput: m(dnhResult.goodput),
			service: m(func(x dnhResult) float64 { return float64(x.service) / float64(time.Millisecond) }),
		}
	}
	return r
}

// median of v (the mean of the middle two for an even count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// A dnhTargetRow is one of issue 9's targets in one scenario, with its
// verdict for every resilience variant.
type dnhTargetRow struct {
	target, scenario, ref string
	values                []string // one per dnhVariant
	pass                  []bool
}

// targets checks issue 9's targets on every resilience variant:
// success ≥ bare's in every scenario; ≥ retryablehttp's − 1 point in the
// failure mixes and the sequential caller; ≤ 1.15 attempts per call against
// a dead upstream and a black hole; peak load < 2x in the outages. A
// scenario or reference client missing from the report is skipped.
func (r *dnhReport) targets() []dnhTargetRow {
	var rows []dnhTargetRow
	add := func(target, scenario, refClient string, format func(dnhMedian) (float64, string),
		ok func(v, ref float64) bool, refText func(float64) string) {
		var ref float64
		if refClient != "" {
			m, found := r.med[dnhKey{scenario, refClient}]
			if !found {
				return
			}
			ref, _ = format(m)
		}
		row := dnhTargetRow{target: target, scenario: scenario, ref: refText(ref)}
		for _, v := range dnhVariants {
			m, found := r.med[dnhKey{scenario, v.name}]
			if !found {
				return
			}
			x, text := format(m)
			row.values = append(row.values, text)
			row.pass = append(row.pass, ok(x, ref))
		}
		rows = append(rows, row)
	}
	success := func(m dnhMedian) (float64, string) { return m.success, fmt.Sprintf("%.1f", m.success) }
	perCall := func(m dnhMedian) (float64, string) { return m.perCall, fmt.Sprintf("%.2f", m.perCall) }
	load := func(m dnhMedian) (float64, string) { return m.load, fmt.Sprintf("%.2fx", m.load) }
	for _, sc := range dnhScenarios {
		if sc.rejectCost > 0 {
			continue // issue 19's scenarios: see issue19Targets
		}
		add("success ≥ bare", sc.name, "bare", success,
			func(v, ref float64) bool { return v >= ref },
			func(ref float64) string { return fmt.Sprintf("bare %.1f", ref) })
	}
	for _, name := range []string{"mix20", "mix50", "mix70", "sequential"} {
		add("success ≥ retryablehttp − 1", name, "retryablehttp", success,
			func(v, ref float64) bool { return v >= ref-1 },
			func(ref float64) string { return fmt.Sprintf("retryablehttp %.1f − 1", ref) })
	}
	for _, name := range []string{"dead", "blackhole"} {
		add("attempts/call ≤ 1.15", name, "", perCall,
			func(v, _ float64) bool { return v <= 1.15 },
			func(float64) string { return "1.15" })
	}
	for _, name := range []string{"outage0.3", "outage1", "outage3"} {
		add("peak upstream load < 2x", name, "", load,
			func(v, _ float64) bool { return v < 2 },
			func(float64) string { return "2x" })
	}
	return rows
}

// issue19Targets checks issue 19's do-no-harm targets on every resilience
// variant, for the record only: they are not counted in score (issue 9's).
// Against the upstreams whose rejections cost (rejectcost*): success ≥
// bare's − 1 point and ≥ 97% of the physical limit; in overload2:
// attempts per call ≤ 1.2, peak load ≤ 1.5x, success ≥ bare's.
func (r *dnhReport) issue19Targets() []dnhTargetRow {
	var rows []dnhTargetRow
	row := func(target, scenario, ref string, text func(dnhMedian) string, ok func(dnhMedian) bool) {
		tr := dnhTargetRow{target: target, scenario: scenario, ref: ref}
		for _, v := range dnhVariants {
			m, found := r.med[dnhKey{scenario, v.name}]
			if !found {
				return
			}
			tr.values = append(tr.values, text(m))
			tr.pass = append(tr.pass, ok(m))
		}
		rows = append(rows, tr)
	}
	success := func(m dnhMedian) string { return fmt.Sprintf("%.1f", m.success) }
	for _, sc := range dnhScenarios {
		bare, found := r.med[dnhKey{sc.name, "bare"}]
		if !found {
			continue
		}
		switch {
		case sc.rejectCost > 0:
			row("success ≥ bare − 1", sc.name, fmt.Sprintf("bare %.1f − 1", bare.success), success,
				func(m dnhMedian) bool { return m.success >= bare.success-1 })
			// The limit each client's own upstream had: the same capacity
			// formula with the service time its workers were held for.
			row("goodput ≥ 97% of the physical limit", sc.name,
				fmt.Sprintf("97%% of each run's measured limit (nominal %.1f)", sc.physicalLimit()),
				func(m dnhMedian) string { return fmt.Sprintf("%.1f of %.1f", m.goodput, m.limit) },
				func(m dnhMedian) bool { return m.goodput >= 0.97*m.limit })
		case sc.name == "overload2":
			row("attempts/call ≤ 1.2", sc.name, "1.2", func(m dnhMedian) string { return fmt.Sprintf("%.2f", m.perCall) },
				func(m dnhMedian) bool { return m.perCall <= 1.2 })
			row("peak upstream load ≤ 1.5x", sc.name, "1.5x", func(m dnhMedian) string { return fmt.Sprintf("%.2fx", m.load) },
				func(m dnhMedian) bool { return m.load <= 1.5 })
			row("success ≥ bare", sc.name, fmt.Sprintf("bare %.1f", bare.success), success,
				func(m dnhMedian) bool { return m.success >= bare.success })
		}
	}
	return rows
}

// score counts the targets variant passed, of those checked.
func (r *dnhReport) score(variant string) (passed, total int) {
	i := slices.IndexFunc(dnhVariants, func(v dnhVariant) bool { return v.name == variant })
	if i < 0 {
		return 0, 0
	}
	for _, row := range r.targets() {
		total++
		if row.pass[i] {
			passed++
		}
	}
	return passed, total
}

func (r *dnhReport) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	o := dnhOptions()
	p("# Do no harm (issue 9)\n\n")
	p("Run %s, %s, %d cores", time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), runtime.NumCPU())
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		p(", load %s", strings.Join(strings.Fields(string(la))[:3], "/"))
	}
	var env string
	for _, k := range []string{"DONOHARM_SCENARIOS", "DONOHARM_OUT"} {
		if v := os.Getenv(k); v != "" {
			env += k + "=" + v + " "
		}
	}
	p("; the experiment took %v. `%sgo test -run '^$' -bench BenchmarkDoNoHarm -benchtime 1x -timeout 30m .` in bench/.\n\n", r.wall.Round(time.Second), env)
	p("Open loop at %d calls/s (sequential: one caller, %v between calls), same seeded fates by arrival order for every client; "+
		"medians of %d seeds (%v), each metric separately. Resilience variants start from the library's defaults with time scaled "+
		"as in the faults experiment: AttemptTimeout %v, TotalTimeout %v, Retry.Delay %v, Retry.MaxDelay %v, "+
		"CircuitBreaker.SamplingDuration %v, BreakDuration %v; every other field zero (the defaults at this commit). "+
		"Overload: %d workers, queue %d, service time = workers / capacity.\n\n",
		dnhRate, dnhSeqGap, len(dnhSeeds), dnhSeeds, o.AttemptTimeout, o.TotalTimeout, o.Retry.Delay, o.Retry.MaxDelay,
		o.CircuitBreaker.SamplingDuration, o.CircuitBreaker.BreakDuration, dnhWorkers, dnhQueue)

	table := func(title string, cell func(c dnhClient, m dnhMedian) string) {
		p("## %s\n\n| scenario | calls |", title)
		for _, c := range r.clients {
			p(" %s |", c.name)
		}
		p("\n|---|---:|")
		for range r.clients {
			p("---:|")
		}
		p("\n")
		for _, sc := range dnhScenarios {
			if !slices.ContainsFunc(r.clients, func(c dnhClient) bool { _, ok := r.med[dnhKey{sc.name, c.name}]; return ok }) {
				continue // not run (DONOHARM_SCENARIOS)
			}
			p("| %s | %d |", sc.name, sc.calls)
			for _, c := range r.clients {
				m, ok := r.med[dnhKey{sc.name, c.name}]
				if !ok {
					p(" |")
					continue
				}
				p(" %s |", cell(c, m))
			}
			p("\n")
		}
		p("\n")
	}
	table("Success (% of calls with a 200 and the body read)", func(_ dnhClient, m dnhMedian) string {
		return fmt.Sprintf("%.1f", m.success)
	})
	table("Attempts per call (requests the upstream received / calls)", func(_ dnhClient, m dnhMedian) string {
		return fmt.Sprintf("%.2f", m.perCall)
	})
	table("Peak upstream load (most attempts in any 100 ms / calls offered in 100 ms)", func(_ dnhClient, m dnhMedian) string {
		return fmt.Sprintf("%.2fx", m.load)
	})
	table("Served stale by the fallback layer (% of calls; the oldest Age, whole seconds)", func(_ dnhClient, m dnhMedian) string {
		if m.stale == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f (%.0fs)", m.stale, m.oldest)
	})
	table("Circuit openings", func(c dnhClient, m dnhMedian) string {
		if !c.breaker {
			return "–"
		}
		return fmt.Sprintf("%.0f", m.opens)
	})

	p("## Targets (issue 9)\n\n| target | scenario | reference |")
	for _, v := range dnhVariants {
		p(" %s |", v.name)
	}
	p("\n|---|---|---|")
	for range dnhVariants {
		p("---|")
	}
	p("\n")
	for _, row := range r.targets() {
		p("| %s | %s | %s |", row.target, row.scenario, row.ref)
		for i := range row.values {
			p(" %s %s |", row.values[i], verdict(row.pass[i]))
		}
		p("\n")
	}
	p("\n")
	for _, v := range dnhVariants {
		passed, total := r.score(v.name)
		p("- %s: %d of %d targets PASS\n", v.name, passed, total)
	}
	if rows := r.issue19Targets(); len(rows) > 0 {
		p("\n## Targets of issue 19 (overload; not counted above)\n\n")
		p("rejectcost*: the overloaded upstream's 503s each hold a worker for %.0f%% of a request's service time; "+
			"physical limit = capacity / offered, the capacity measured in each run: the upstream's workers over the time a request in service "+
			"actually held one (its timer fires late, more so on a loaded machine: the nominal service time overstates the capacity; dnhScenario.measuredLimit). "+
			"Goodput, rate against rate: the %% of calls served while the load was offered, before the last call started (success also counts what a client "+
			"had still queued then). "+
			"Median service time measured, ms (nominal in brackets):%s\n\n| target | scenario | reference |", 100*rejectCostOf(dnhScenarios), r.serviceTimes())
		for _, v := range dnhVariants {
			p(" %s |", v.name)
		}
		p("\n|---|---|---|")
		for range dnhVariants {
			p("---|")
		}
		p("\n")
		for _, row := range rows {
			p("| %s | %s | %s |", row.target, row.scenario, row.ref)
			for i := range row.values {
				p(" %s %s |", row.values[i], verdict(row.pass[i]))
			}
			p("\n")
		}
	}
	return b.String()
}

// serviceTimes lists, for each rejection-cost scenario, the median service
// time each client's upstream measured, beside the nominal one.
func (r *dnhReport) serviceTimes() string {
	var b strings.Builder
	for _, sc := range dnhScenarios {
		if sc.rejectCost == 0 {
			continue
		}
		fmt.Fprintf(&b, " %s (%.1f):", sc.name, float64(sc.serviceTime())/float64(time.Millisecond))
		sep := " "
		for _, c := range r.clients {
			if m, ok := r.med[dnhKey{sc.name, c.name}]; ok {
				fmt.Fprintf(&b, "%s%s %.2f", sep, c.name, m.service)
				sep = ", "
			}
		}
		b.WriteString(";")
	}
	return strings.TrimSuffix(b.String(), ";") + "."
}

// rejectCostOf is the first scenario's rejection cost (they share one).
func rejectCostOf(scs []dnhScenario) float64 {
	for _, sc := range scs {
		if sc.rejectCost > 0 {
			return sc.rejectCost
		}
	}
	return 0
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}
