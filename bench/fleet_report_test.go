package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fleet experiment's report (issue 31): per kind and run a summary
// (fleetSummarize), kept as a row (fleetRow) in results/name.json so that
// several runs can be reported as one (BenchmarkFleetMerge); the report
// (fleetMarkdown) has the medians over the seeds judged against the issue's
// targets, the Handlers' and the server half's counters, and every run.

// Recovery, as the fleet experiment reads it: the first 500 ms window
// after the trigger's end from which every window, to the end of the
// arrivals, has ≥ 90% of the calls started in it served. The overload
// experiment's reading (three consecutive windows with ≥ 95%, issue 31's
// own) is reported beside it.
const (
	fleetRecoveryShare = 0.90
)

// A run is judged only if the machine could run it: bare served at least
// fleetCalibration % of the calls it started from 1 s to fleetCalibMargin
// before the trigger (at 80 % of C with nothing wrong it serves them all;
// the margin keeps out the calls a stall catches in the queue), and the
// calls started at most nhLagTooLoaded late at p99.
const (
	fleetCalibration = 99.5
	fleetCalibMargin = 500 * time.Millisecond
)

// Issue 31's fleet targets ("Done when"): during the slowdown and the
// capacity drop, goodput ≥ fleetGoodputFloor % of the physical limit and
// ≥ bare's less fleetBareMargin points, recovery (three 500 ms windows at
// ≥ 95 %) at most fleetRecoveryMax after the trigger, at most
// fleetWastedMax % of the upstream's busy time on callers gone; for the
// stall, served in the 4 s after it ≥ bare's less fleetStallMargin.
const (
	fleetGoodputFloor = 90.0
	fleetBareMargin   = 2.0
	fleetRecoveryMax  = 2.0 // seconds
	fleetWastedMax    = 5.0
)

// fleetSummary is one kind's run in figures.
type fleetSummary struct {
	trigPct     float64 // calls served during the trigger, % of min(offered, capacity during it)
	afterPct    float64 // calls served in the tl.after after it, % of min(offered, C)
	after4Pct   float64 // the overload experiment's: served in the ovlAfter after it, % of min(offered, C)
	recovery    float64 // seconds from the trigger's end (fleetRecoveryShare, to the end); +Inf: never
	recovery95  float64 // the overload experiment's: three windows ≥ 95%; +Inf: never
	steadyPct   float64 // % of the calls started from 1 s to the trigger that were served
	calibPct    float64 // % of the calls started from 1 s to fleetCalibMargin before the trigger that were served (NaN: none)
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
	f := fleetSummary{trigPct: math.NaN(), afterPct: math.NaN(), after4Pct: math.NaN(), recovery: math.Inf(1), recovery95: math.Inf(1), calibPct: math.NaN()}
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
	if n, ok := startedIn(time.Second, from-fleetCalibMargin); n > 0 {
		f.calibPct = 100 * float64(ok) / float64(n)
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
	switch {
	case math.IsInf(s, 1):
		return "never"
	case math.IsNaN(s):
		return "–"
	}
	return fmt.Sprintf("%.1fs", s)
}

func fleetInt(v float64) string { return fmt.Sprintf("%.0f", v) }
func fleetDec(v float64) string { return fmt.Sprintf("%.2f", v) }

// fleetNum is a figure as a results file keeps it: JSON has no NaN (no
// figure: null) and no infinity (recovery never: "never").
type fleetNum float64

func (v fleetNum) MarshalJSON() ([]byte, error) {
	f := float64(v)
	switch {
	case math.IsNaN(f):
		return []byte("null"), nil
	case math.IsInf(f, 1):
		return []byte(`"never"`), nil
	case math.IsInf(f, -1):
		return nil, fmt.Errorf("fleetNum: -Inf is no figure")
	}
	return json.Marshal(f)
}

func (v *fleetNum) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "null":
		*v = fleetNum(math.NaN())
		return nil
	case `"never"`:
		*v = fleetNum(math.Inf(1))
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*v = fleetNum(f)
	return nil
}

// fleetRow is one kind's side of one run in figures: what the report's
// tables are made of, and what a results file keeps (results/name.json),
// so that the reports of several runs can be merged (BenchmarkFleetMerge).
type fleetRow struct {
	Trigger string `json:"trigger"`
	Stall   bool   `json:"stall"`
	Mode    string `json:"mode"`
	N       int    `json:"n"`
	Seed    uint64 `json:"seed"`
	Kind    string `json:"kind"`
	Handler bool   `json:"handler"` // it has Handlers: the counters apply
	Behind  bool   `json:"behind"`  // its upstream was behind the server half

	Calls       int      `json:"calls"`
	TrigPct     fleetNum `json:"trigger_pct"`
	After4Pct   fleetNum `json:"after4_pct"`
	AfterPct    fleetNum `json:"after_pct"`
	Recovery    fleetNum `json:"recovery_s"`
	Recovery95  fleetNum `json:"recovery95_s"`
	SteadyPct   fleetNum `json:"before_pct"`
	CalibPct    fleetNum `json:"calibration_pct"`
	OKPct       fleetNum `json:"ok_pct"`
	PerCall     fleetNum `json:"arrived_per_call"`
	SentPerCall fleetNum `json:"sent_per_call"`
	WastedPct   fleetNum `json:"wasted_pct"`
	// calls by how they ended: ok, timeout, ErrOverloaded, ErrCircuitOpen,
	// another status, another error
	OK, Timeout, Overloaded, CircuitOpen, Status, Other int

	PeakIn     int64 `json:"peak_in_flight"`
	PeakHeld   int   `json:"peak_held"`
	UpArrivals int   `json:"upstream_arrivals"`
	UpDropped  int   `json:"upstream_dropped"`

	HandlersOpened  int   `json:"handlers_opened"`
	Opened          int64 `json:"opened"`
	BudgetRefused   int64 `json:"budget_refused"`
	Shed            int64 `json:"shed"`
	AttemptTimeouts int64 `json:"attempt_timeouts"`
	Attempts        int64 `json:"attempts"`
	Retries         int64 `json:"retries"`
	Pushback        int64 `json:"pushback"`

	Server fleetServerTotals `json:"server"`

	CPU    float64       `json:"cpu"`
	LagP99 time.Duration `json:"lag_p99_ns"`
}

// fleetRowOf is side s of run r as a row.
func fleetRowOf(r fleetRun, s fleetSide) fleetRow {
	f := fleetSummarize(r, s)
	t := s.totals
	return fleetRow{
		Trigger: r.trigger, Stall: r.cfg.trigger.stall, Mode: r.mode, N: r.n, Seed: r.seed, Kind: s.kind,
		Handler: slices.ContainsFunc(fleetKinds, func(k fleetKind) bool { return k.name == s.kind && k.handler }),
		Behind:  s.behind,
		Calls:   len(s.calls), TrigPct: fleetNum(f.trigPct), After4Pct: fleetNum(f.after4Pct), AfterPct: fleetNum(f.afterPct),
		Recovery: fleetNum(f.recovery), Recovery95: fleetNum(f.recovery95), SteadyPct: fleetNum(f.steadyPct), CalibPct: fleetNum(f.calibPct),
		OKPct: fleetNum(f.okPct), PerCall: fleetNum(f.perCall), SentPerCall: fleetNum(f.sentPerCall), WastedPct: fleetNum(f.wastedPct),
		OK: f.outcomes[fleetOK], Timeout: f.outcomes[fleetTimeout], Overloaded: f.outcomes[fleetOverloaded],
		CircuitOpen: f.outcomes[fleetCircuitOpen], Status: f.outcomes[fleetStatus], Other: f.outcomes[fleetOther],
		PeakIn: s.peakIn, PeakHeld: s.up.peakHeld, UpArrivals: s.up.totals.arrivals, UpDropped: s.up.totals.dropped,
		HandlersOpened: t.handlersOpened, Opened: t.opened, BudgetRefused: t.budgetRefused, Shed: t.shed,
		AttemptTimeouts: t.attemptTimeouts, Attempts: t.attempts, Retries: t.retries, Pushback: t.pushback,
		Server: s.server, CPU: r.cpu, LagP99: r.lagP99,
	}
}

// fleetMeta says how a results file was made.
type fleetMeta struct {
	Date       string        `json:"date"`
	Go         string        `json:"go"`
	Commit     string        `json:"commit"`
	Cores      int           `json:"cores"`
	LoadBefore string        `json:"load_before"`
	LoadAfter  string        `json:"load_after"`
	Wall       time.Duration `json:"wall_ns"`
	Command    string        `json:"command"`
	// the timeline of every run in it
	Before  time.Duration `json:"before_ns"`
	Trigger time.Duration `json:"trigger_ns"`
	After   time.Duration `json:"after_ns"`
}

// fleetResults is what BenchmarkFleet keeps of a run of the experiment
// (results/name.json), and what BenchmarkFleetMerge reads.
type fleetResults struct {
	Meta fleetMeta  `json:"meta"`
	Rows []fleetRow `json:"rows"`
}

// fleetResultsOf is BenchmarkFleet's runs, made with p, as results.
func fleetResultsOf(p fleetParams, runs []fleetRun, wall time.Duration, loadBefore, loadAfter string) fleetResults {
	res := fleetResults{Meta: fleetMeta{
		Date: time.Now().UTC().Format("2006-01-02T15:04Z"), Go: runtime.Version(), Commit: fleetCommit(), Cores: runtime.NumCPU(),
		LoadBefore: loadBefore, LoadAfter: loadAfter, Wall: wall, Command: fleetCommand(),
		Before: p.tl.before, Trigger: p.tl.trigger, After: p.tl.after,
	}}
	for _, r := range runs {
		for _, s := range r.sides {
			res.Rows = append(res.Rows, fleetRowOf(r, s))
		}
	}
	return res
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

// fleetCommand is the go test command line that makes this report.
func fleetCommand() string {
	var env []string
	for _, k := range []string{"FLEET_N", "FLEET_SEEDS", "FLEET_TRIGGERS", "FLEET_MODES", "FLEET_KINDS", "FLEET_QUICK", "FLEET_OUT"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	env = append(env, "go test -run '^$' -bench '^BenchmarkFleet$' -benchtime 1x -timeout 30m .")
	return strings.Join(env, " ")
}

// fleetRunKey names a run of the experiment apart from its kinds: the
// kinds that run alone have rows of their own under the same key.
type fleetRunKey struct {
	trigger, mode string
	n             int
	seed          uint64
}

func (r fleetRow) runKey() fleetRunKey { return fleetRunKey{r.Trigger, r.Mode, r.N, r.Seed} }

// fleetGroupKey is a line of the medians table: the seeds of a kind.
type fleetGroupKey struct {
	trigger, mode string
	n             int
	kind          string
}

func (r fleetRow) groupKey() fleetGroupKey { return fleetGroupKey{r.Trigger, r.Mode, r.N, r.Kind} }

// fleetMerge puts the rows of several results together: every timeline
// must be the same, and no (trigger, mode, N, seed, kind) may be in two.
func fleetMerge(files []fleetResults) ([]fleetRow, error) {
	type rowKey struct {
		run  fleetRunKey
		kind string
	}
	seen := map[rowKey]bool{}
	var rows []fleetRow
	for i, f := range files {
		m0, m := files[0].Meta, f.Meta
		if m.Before != m0.Before || m.Trigger != m0.Trigger || m.After != m0.After {
			return nil, fmt.Errorf("results %d has the timeline %v/%v/%v, the first %v/%v/%v", i+1, m.Before, m.Trigger, m.After, m0.Before, m0.Trigger, m0.After)
		}
		for _, r := range f.Rows {
			k := rowKey{r.runKey(), r.Kind}
			if seen[k] {
				return nil, fmt.Errorf("%s %s N=%d seed %d %s is in two results", r.Trigger, r.Mode, r.N, r.Seed, r.Kind)
			}
			seen[k] = true
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// fleetMedian is the median of vs, NaNs left out (NaN if nothing is left);
// +Inf (never) sorts last.
func fleetMedian(vs []float64) float64 {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	k := len(vs) / 2
	if len(vs)%2 == 1 {
		return vs[k]
	}
	if math.IsInf(vs[k], 1) {
		return vs[k]
	}
	return (vs[k-1] + vs[k]) / 2
}

// fleetLoaded says why the machine was too loaded to judge the run of key,
// or "" if it was not: bare under its calibration before the trigger, or
// the calls started late. Without bare's row the run cannot be judged.
func fleetLoaded(rows []fleetRow, key fleetRunKey) string {
	var why []string
	bare := false
	for _, r := range rows {
		if r.runKey() != key {
			continue
		}
		if r.LagP99 > nhLagTooLoaded {
			why = append(why, fmt.Sprintf("%s's calls started %v late at p99", r.Kind, r.LagP99.Round(time.Millisecond)))
		}
		if r.Kind == "bare" {
			bare = true
			if c := float64(r.CalibPct); math.IsNaN(c) || c < fleetCalibration {
				why = append(why, fmt.Sprintf("bare served %s %% before the trigger, under its calibration %.1f %%", ovlFmtPct1(c), fleetCalibration))
			}
		}
	}
	if !bare {
		why = append(why, "no bare run to calibrate against")
	}
	return strings.Join(why, "; ")
}

// ovlFmtPct1 is a % with one decimal, "–" for no figure.
func ovlFmtPct1(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.1f", x)
}

// fleetMisses lists the targets row (or a median of rows) misses against
// bare's figures: goodput, recovery and waste for the slowdown and the
// capacity drop, served after it for the stall. Empty: every target met.
func fleetMisses(stall bool, lib, bare fleetFigures) []string {
	var miss []string
	if stall {
		if !fleetStallMet(bare.after4, lib.after4) {
			miss = append(miss, fmt.Sprintf("after 4 s %s < bare %s − %.0f", ovlFmtPct(lib.after4), ovlFmtPct(bare.after4), fleetStallMargin))
		}
		return miss
	}
	switch {
	case math.IsNaN(lib.trig) || lib.trig < fleetGoodputFloor:
		miss = append(miss, fmt.Sprintf("trigger %s < %.0f", ovlFmtPct(lib.trig), fleetGoodputFloor))
	case math.IsNaN(bare.trig) || lib.trig < bare.trig-fleetBareMargin:
		miss = append(miss, fmt.Sprintf("trigger %s < bare %s − %.0f", ovlFmtPct(lib.trig), ovlFmtPct(bare.trig), fleetBareMargin))
	}
	if !(lib.recovery95 <= fleetRecoveryMax) {
		miss = append(miss, fmt.Sprintf("recovery %s > %.0fs", fleetFmtRecovery(lib.recovery95), fleetRecoveryMax))
	}
	if !(lib.wasted <= fleetWastedMax) {
		miss = append(miss, fmt.Sprintf("wasted %s > %.0f", ovlFmtPct(lib.wasted), fleetWastedMax))
	}
	return miss
}

// fleetFigures are the figures the targets read.
type fleetFigures struct{ trig, after4, recovery95, wasted float64 }

func (r fleetRow) figures() fleetFigures {
	return fleetFigures{float64(r.TrigPct), float64(r.After4Pct), float64(r.Recovery95), float64(r.WastedPct)}
}

// fleetMedianFigures are the medians of rows' figures.
func fleetMedianFigures(rows []fleetRow) fleetFigures {
	col := func(f func(fleetRow) fleetNum) float64 {
		v := make([]float64, len(rows))
		for i, r := range rows {
			v[i] = float64(f(r))
		}
		return fleetMedian(v)
	}
	return fleetFigures{
		trig:       col(func(r fleetRow) fleetNum { return r.TrigPct }),
		after4:     col(func(r fleetRow) fleetNum { return r.After4Pct }),
		recovery95: col(func(r fleetRow) fleetNum { return r.Recovery95 }),
		wasted:     col(func(r fleetRow) fleetNum { return r.WastedPct }),
	}
}

// fleetVerdict is a line of the medians table judged: met on the medians
// (against bare's medians), in how many seeds it was met against bare's
// run of the same seed, and why it is not judged, if it is not.
type fleetVerdict struct {
	judged      bool
	why         string   // not judged: why
	misses      []string // on the medians
	seedsMet    int
	seedsJudged int
}

func (v fleetVerdict) String() string {
	switch {
	case !v.judged:
		return "not judged: " + v.why
	case len(v.misses) == 0:
		return fmt.Sprintf("**met** (%d/%d seeds)", v.seedsMet, v.seedsJudged)
	}
	return fmt.Sprintf("no: %s (%d/%d seeds met)", strings.Join(v.misses, ", "), v.seedsMet, v.seedsJudged)
}

// fleetJudge judges kind's rows in group g against bare's: judged only if
// every seed's run was (fleetLoaded).
func fleetJudge(all []fleetRow, g fleetGroupKey, rows []fleetRow) fleetVerdict {
	var v fleetVerdict
	var bare []fleetRow
	var loaded []string
	for _, r := range rows {
		key := r.runKey()
		if why := fleetLoaded(all, key); why != "" {
			loaded = append(loaded, fmt.Sprintf("seed %d: %s", r.Seed, why))
			continue
		}
		i := slices.IndexFunc(all, func(b fleetRow) bool { return b.runKey() == key && b.Kind == "bare" })
		b := all[i] // fleetLoaded found it
		bare = append(bare, b)
		v.seedsJudged++
		if len(fleetMisses(r.Stall, r.figures(), b.figures())) == 0 {
			v.seedsMet++
		}
	}
	if len(loaded) > 0 {
		v.why = "machine too loaded (" + strings.Join(loaded, "; ") + ")"
		return v
	}
	v.judged = true
	v.misses = fleetMisses(rows[0].Stall, fleetMedianFigures(rows), fleetMedianFigures(bare))
	return v
}

// fleetGroups orders rows into the medians table's lines: by trigger,
// mode, N and kind in the order the rows first name them (kinds in
// fleetKinds' order).
func fleetGroupRows(rows []fleetRow) ([]fleetGroupKey, map[fleetGroupKey][]fleetRow) {
	var triggers, modes, kinds []string
	var ns []int
	groups := map[fleetGroupKey][]fleetRow{}
	for _, r := range rows {
		if !slices.Contains(triggers, r.Trigger) {
			triggers = append(triggers, r.Trigger)
		}
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
		if !slices.Contains(ns, r.N) {
			ns = append(ns, r.N)
		}
		if !slices.Contains(kinds, r.Kind) {
			kinds = append(kinds, r.Kind)
		}
		groups[r.groupKey()] = append(groups[r.groupKey()], r)
	}
	order := func(name string) int {
		if i := slices.IndexFunc(fleetKinds, func(k fleetKind) bool { return k.name == name }); i >= 0 {
			return i
		}
		return len(fleetKinds)
	}
	slices.SortStableFunc(kinds, func(a, b string) int { return order(a) - order(b) })
	slices.SortStableFunc(modes, func(a, b string) int { return ovlModeOrder(a) - ovlModeOrder(b) })
	slices.Sort(ns)
	var keys []fleetGroupKey
	for _, tr := range triggers {
		for _, m := range modes {
			for _, n := range ns {
				for _, k := range kinds {
					g := fleetGroupKey{tr, m, n, k}
					if rs := groups[g]; len(rs) > 0 {
						slices.SortFunc(rs, func(a, b fleetRow) int { return cmpUint(a.Seed, b.Seed) })
						keys = append(keys, g)
					}
				}
			}
		}
	}
	return keys, groups
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ovlModeOrder puts the oblivious upstream before the aware one.
func ovlModeOrder(name string) int {
	if i := slices.IndexFunc(ovlModes, func(m ovlMode) bool { return m.name == name }); i >= 0 {
		return i
	}
	return len(ovlModes)
}

// fleetSeedsOf lists the seeds of rows.
func fleetSeedsOf(rows []fleetRow) string {
	var seeds []uint64
	for _, r := range rows {
		seeds = append(seeds, r.Seed)
	}
	slices.Sort(seeds)
	return ovlJoinSeeds(slices.Compact(seeds))
}

// fleetMarkdown is the report of the results in files (one BenchmarkFleet
// run, or several merged): how they were made, the medians table and its
// verdicts, the counters' medians, and every run.
func fleetMarkdown(files []fleetResults) (string, error) {
	rows, err := fleetMerge(files)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	o := dnhOptions()
	m0 := files[0].Meta
	tl := fleetTimeline{before: m0.Before, trigger: m0.Trigger, after: m0.After}
	p("# Fleet: N replicas, each its own Handler, one upstream (issue 31)\n\n")
	if len(files) == 1 {
		p("Run %s, %s, commit %s, %d cores, load before %s, after %s; the experiment took %v. In bench/: `%s`.\n\n",
			m0.Date, m0.Go, m0.Commit, m0.Cores, m0.LoadBefore, m0.LoadAfter, m0.Wall.Round(time.Second), m0.Command)
	} else {
		p("%d runs of the experiment, merged (`FLEET_MERGE=… go test -run '^$' -bench '^BenchmarkFleetMerge$' -benchtime 1x .` in bench/, from their results/*.json):\n\n", len(files))
		for _, f := range files {
			m := f.Meta
			p("- %s, %s, commit %s, %d cores, load before %s, after %s, %v: `%s`\n",
				m.Date, m.Go, m.Commit, m.Cores, m.LoadBefore, m.LoadAfter, m.Wall.Round(time.Second), m.Command)
		}
		p("\n")
	}
	var trs []ovlTrigger
	for _, tr := range fleetTriggers(tl) {
		if slices.ContainsFunc(rows, func(r fleetRow) bool { return r.Trigger == tr.name }) {
			trs = append(trs, tr)
		}
	}
	p("Upstream: the overload experiment's, %d workers × %v, one FIFO queue, nothing shed, C = %.0f calls/s; oblivious (it serves every request it queued) or aware (it drops, before service, a request whose caller has gone or whose deadline has passed). "+
		"Load: open-loop Poisson arrivals at %.0f%% of C (%.0f calls/s) for %v (%v before the trigger, %v of trigger, %v after), "+
		"each call given to one of N replicas uniformly at random; every call has a %v deadline. "+
		"The kinds of a run run at the same time, each its N replicas (each its own client and its own http.Transport) against its own identical upstream, "+
		"on the same arrivals and the same replica numbers (go-retryablehttp in a run of its own, right after, on the same arrivals). Triggers: %s.\n\n",
		ovlWorkers, ovlService, ovlCapacity, 100*ovlLoad, ovlLoad*ovlCapacity, tl.runFor(), tl.before, tl.trigger, tl.after,
		ovlCallerDeadline, ovlTriggerText(trs))
	p("Kinds:\n\n")
	for _, k := range fleetKinds {
		if slices.ContainsFunc(rows, func(r fleetRow) bool { return r.Kind == k.name }) {
			p("- `%s`: %s\n", k.name, k.doc)
		}
	}
	p("\nThe handler's scaled options: AttemptTimeout %v, TotalTimeout %v, Retry.Delay %v, Retry.MaxDelay %v, CircuitBreaker.SamplingDuration %v, BreakDuration %v, Overload.MaxQueueWait %v; the rest are the defaults.\n\n",
		o.AttemptTimeout, o.TotalTimeout, o.Retry.Delay, o.Retry.MaxDelay, o.CircuitBreaker.SamplingDuration, o.CircuitBreaker.BreakDuration, o.Overload.MaxQueueWait)

	var cpuMax float64
	var lagMax time.Duration
	var loaded []string
	runs := map[fleetRunKey]bool{}
	for _, r := range rows {
		cpuMax = max(cpuMax, r.CPU)
		lagMax = max(lagMax, r.LagP99)
		if k := r.runKey(); !runs[k] {
			runs[k] = true
			if why := fleetLoaded(rows, k); why != "" {
				loaded = append(loaded, fmt.Sprintf("%s %s N=%d seed %d: %s", k.trigger, k.mode, k.n, k.seed, why))
			}
		}
	}
	p("Machine check: the busiest run used %.2f of %d cores (process CPU time / wall time: every kind's clients and upstreams together); "+
		"the worst p99 lateness of a call's start against its schedule was %v. A run is judged only if bare served ≥ %.1f %% of the calls it started from 1 s to %v before the trigger and the calls started at most %v late at p99: ",
		cpuMax, m0.Cores, lagMax.Round(time.Millisecond), fleetCalibration, fleetCalibMargin, nhLagTooLoaded)
	if len(loaded) == 0 {
		p("all %d were.\n\n", len(runs))
	} else {
		p("%d of %d were not, the machine too loaded to judge them:\n\n", len(loaded), len(runs))
		for _, l := range loaded {
			p("- %s\n", l)
		}
		p("\n")
	}

	keys, groups := fleetGroupRows(rows)
	p("## Medians over seeds %s\n\n", fleetSeedsOf(rows))
	p("Issue 31's targets, judged on the medians (the kind's against bare's), with in brackets the seeds in which the kind's run met them against bare's run of the same seed: "+
		"slowdown and capacity drop, **trigger %%** (calls served during the trigger, %% of the physical limit min(offered, capacity during it)) ≥ %.0f and ≥ bare's − %.0f, "+
		"**recovery** (from the trigger's end to the first of three 500 ms windows with ≥ 95 %% of the calls started in them served) ≤ %.0f s, "+
		"**wasted** (share of the upstream's busy time, from the trigger to the end of the arrivals, on attempts whose caller had given up by the time their service finished) ≤ %.0f %%; "+
		"the stall, **after 4 s %%** (calls served in the %v after it, %% of min(offered, C)) ≥ bare's − %.0f. "+
		"**Recovery ≥ 90 %%**: the first window from which every window to the end had ≥ 90 %% served (never: the last one did not).\n\n",
		fleetGoodputFloor, fleetBareMargin, fleetRecoveryMax, fleetWastedMax, ovlAfter, fleetStallMargin)
	p("| trigger | mode | N | kind | trigger %% | after 4 s %% | recovery | recovery ≥ 90 %% | wasted %% | verdict |\n")
	p("|---|---|---:|---|---:|---:|---:|---:|---:|---|\n")
	met, judged := map[string]int{}, map[string]int{}
	for _, g := range keys {
		rs := groups[g]
		med := func(f func(fleetRow) fleetNum) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = float64(f(r))
			}
			return fleetMedian(v)
		}
		verdict := "(reference)"
		if g.kind != "bare" {
			v := fleetJudge(rows, g, rs)
			verdict = v.String()
			if v.judged {
				judged[g.kind]++
				if len(v.misses) == 0 {
					met[g.kind]++
				}
			}
		}
		p("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", g.trigger, g.mode, g.n, g.kind,
			ovlFmtPct(med(func(r fleetRow) fleetNum { return r.TrigPct })),
			ovlFmtPct(med(func(r fleetRow) fleetNum { return r.After4Pct })),
			fleetFmtRecovery(med(func(r fleetRow) fleetNum { return r.Recovery95 })),
			fleetFmtRecovery(med(func(r fleetRow) fleetNum { return r.Recovery })),
			ovlFmtPct(med(func(r fleetRow) fleetNum { return r.WastedPct })), verdict)
	}
	p("\n")
	for _, k := range fleetKinds {
		if judged[k.name] > 0 {
			p("- `%s`: targets met in %d of %d lines judged\n", k.name, met[k.name], judged[k.name])
		}
	}
	p("\n")

	p("## The Handlers, their upstream and its server half: medians over the seeds\n\n")
	p("Summed over the fleet's Handlers (Options.OnEvent): **opened**: Handlers whose circuit opened at least once, of N; **budget**: retries the retry budget refused (EventBudgetExceeded); " +
		"**shed**: attempts the overload limiter refused or shed (EventOverloadShed), in brackets calls that failed with ErrOverloaded; **attempt timeouts**: EventAttemptTimeout; " +
		"**retries**: retries sent (EventAttempt with Attempt > 1); **pushbacks**: answers that said not to retry (EventPushback). " +
		"**attempts/call**: attempts the upstream received per call; **in flight / held**: the most attempts in flight at once at the fleet's bases (sent, no headers yet) against the most requests the upstream held at once (queued + in service); " +
		"**dropped**: requests the aware upstream dropped before service (caller gone or deadline passed); " +
		"**server refusals**: by package server's middleware (server.Event), budget spent or too small / retry over the retried share / MaxConcurrent, in brackets those that carried the pushback \"do not retry\".\n\n")
	p("| trigger | mode | N | kind | opened | budget | shed (calls) | attempt timeouts | retries | pushbacks | attempts/call | in flight / held | dropped | server refusals |\n")
	p("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, g := range keys {
		rs := groups[g]
		med := func(f func(fleetRow) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return fleetMedian(v)
		}
		mi := func(f func(fleetRow) float64) string { return fleetInt(med(f)) }
		counters := "– | – | – | – | – | –"
		if rs[0].Handler {
			counters = fmt.Sprintf("%s | %s | %s (%s) | %s | %s | %s",
				mi(func(r fleetRow) float64 { return float64(r.HandlersOpened) }),
				mi(func(r fleetRow) float64 { return float64(r.BudgetRefused) }),
				mi(func(r fleetRow) float64 { return float64(r.Shed) }),
				mi(func(r fleetRow) float64 { return float64(r.Overloaded) }),
				mi(func(r fleetRow) float64 { return float64(r.AttemptTimeouts) }),
				mi(func(r fleetRow) float64 { return float64(r.Retries) }),
				mi(func(r fleetRow) float64 { return float64(r.Pushback) }))
		}
		srv := "–"
		if rs[0].Behind {
			srv = fmt.Sprintf("%s / %s / %s (%s)",
				mi(func(r fleetRow) float64 { return float64(r.Server.Expired) }),
				mi(func(r fleetRow) float64 { return float64(r.Server.RetryRefused) }),
				mi(func(r fleetRow) float64 { return float64(r.Server.Overloaded) }),
				mi(func(r fleetRow) float64 { return float64(r.Server.Stop) }))
		}
		p("| %s | %s | %d | %s | %s | %s | %s / %s | %s | %s |\n", g.trigger, g.mode, g.n, g.kind, counters,
			fleetDec(med(func(r fleetRow) float64 { return float64(r.PerCall) })),
			mi(func(r fleetRow) float64 { return float64(r.PeakIn) }),
			mi(func(r fleetRow) float64 { return float64(r.PeakHeld) }),
			mi(func(r fleetRow) float64 { return float64(r.UpDropped) }), srv)
	}
	p("\n")

	p("## Every run\n\n")
	p("Per seed. Calls: offered in the run; **after %%**: calls served in the %v after the trigger, %% of min(offered, C); **before %%**: calls started from 1 s to the trigger that were served; "+
		"**sent/call**: attempts the bases sent per call; **arrived/call**: attempts the upstream received per call; "+
		"**failures**: calls that failed, by what the caller saw: timeout / ErrOverloaded / ErrCircuitOpen / a status other than 200 / other; "+
		"**server**: the server half's refusals, expired / retry share / overloaded (pushback stop).\n\n", tl.after)
	p("| trigger | mode | N | seed | kind | calls | trigger %% | after 4 s %% | after %% | recovery | recovery ≥ 90 %% | before %% | ok %% | sent/call | arrived/call | wasted %% | in flight / held | dropped | opened (events) | budget | shed | attempt timeouts | retries | pushbacks | server | failures | cpu | lag p99 |\n")
	p("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|\n")
	for _, g := range keys {
		for _, r := range groups[g] {
			srv := "–"
			if r.Behind {
				srv = fmt.Sprintf("%d / %d / %d (%d)", r.Server.Expired, r.Server.RetryRefused, r.Server.Overloaded, r.Server.Stop)
			}
			p("| %s | %s | %d | %d | %s | %d | %s | %s | %s | %s | %s | %.1f | %.1f | %.2f | %.2f | %.0f | %d / %d | %d | %d (%d) | %d | %d | %d | %d | %d | %s | %d / %d / %d / %d / %d | %.2f | %v |\n",
				r.Trigger, r.Mode, r.N, r.Seed, r.Kind, r.Calls, ovlFmtPct(float64(r.TrigPct)), ovlFmtPct(float64(r.After4Pct)), ovlFmtPct(float64(r.AfterPct)),
				fleetFmtRecovery(float64(r.Recovery95)), fleetFmtRecovery(float64(r.Recovery)), float64(r.SteadyPct), float64(r.OKPct),
				float64(r.SentPerCall), float64(r.PerCall), float64(r.WastedPct), r.PeakIn, r.PeakHeld, r.UpDropped,
				r.HandlersOpened, r.Opened, r.BudgetRefused, r.Shed, r.AttemptTimeouts, r.Retries, r.Pushback, srv,
				r.Timeout, r.Overloaded, r.CircuitOpen, r.Status, r.Other, r.CPU, r.LagP99.Round(time.Millisecond))
		}
	}
	return b.String(), nil
}

// fleetStallMargin is issue 31's stall target: the handler's fleet serves,
// in the ovlAfter after the stall, at least bare's figure less this many
// points.
const fleetStallMargin = 2.0

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

// fleetWriteResults writes res as results/name.json and its report as
// results/name.md, and returns the report.
func fleetWriteResults(name string, res fleetResults) (string, error) {
	md, err := fleetMarkdown([]fleetResults{res})
	if err != nil {
		return "", err
	}
	js, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll("results", 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join("results", name+".json"), append(js, '\n'), 0o644); err != nil {
		return "", err
	}
	return md, os.WriteFile(filepath.Join("results", name+".md"), []byte(md), 0o644)
}

// BenchmarkFleetMerge writes one report of several runs of BenchmarkFleet:
// FLEET_MERGE=a,b,... names their results (results/a.json, ...), in the
// order their sources are listed; FLEET_OUT=name writes results/name.md
// (default fleet). It runs nothing: the runs' rows are put together (the
// same timeline, no row twice) and judged as one.
func BenchmarkFleetMerge(b *testing.B) {
	names := fleetEnvList("FLEET_MERGE", "")
	if len(names) == 0 {
		b.Fatal("FLEET_MERGE names no results: FLEET_MERGE=fleet-a,fleet-b")
	}
	out := "fleet"
	if s := os.Getenv("FLEET_OUT"); s != "" {
		out = s
	}
	var files []fleetResults
	for _, n := range names {
		raw, err := os.ReadFile(filepath.Join("results", n+".json"))
		if err != nil {
			b.Fatal(err)
		}
		var res fleetResults
		if err := json.Unmarshal(raw, &res); err != nil {
			b.Fatalf("%s: %v", n, err)
		}
		files = append(files, res)
	}
	md, err := fleetMarkdown(files)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("results", out+".md"), []byte(md), 0o644); err != nil {
		b.Fatal(err)
	}
	fmt.Print(md)
}

// TestFleetMedian checks the median the report takes over seeds: the
// middle of an odd count, the mean of the two middle values of an even
// one, no figure (NaN) left out, never (+Inf) last.
func TestFleetMedian(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	assert.Equal(t, 2.0, fleetMedian([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, fleetMedian([]float64{4, 1, 3, 2}))
	assert.Equal(t, 2.0, fleetMedian([]float64{nan, 3, 1}), "NaN left out: the mean of 1 and 3")
	assert.True(t, math.IsNaN(fleetMedian([]float64{nan, nan})))
	assert.True(t, math.IsNaN(fleetMedian(nil)))
	assert.Equal(t, inf, fleetMedian([]float64{inf, 0.5, inf}), "never in two seeds of three is never")
	assert.Equal(t, 0.5, fleetMedian([]float64{inf, 0.5, 0}))
	assert.Equal(t, inf, fleetMedian([]float64{inf, 0.5}), "a mean with never is never")
}

// fleetTestRow is a made-up row: a healthy run of kind, or with the
// figures given.
func fleetTestRow(trigger string, seed uint64, kind string, trig, recovery95, wasted float64) fleetRow {
	return fleetRow{Trigger: trigger, Stall: trigger == "stall2s", Mode: "oblivious", N: 10, Seed: seed, Kind: kind,
		TrigPct: fleetNum(trig), After4Pct: fleetNum(trig), Recovery95: fleetNum(recovery95), WastedPct: fleetNum(wasted),
		CalibPct: 100, LagP99: time.Millisecond}
}

// TestFleetJudge checks the verdicts of the medians table on made-up rows:
// each target missed alone, the comparison with bare by medians and seed by
// seed, the stall's own target, and a machine too loaded to judge.
func TestFleetJudge(t *testing.T) {
	judge := func(rows []fleetRow, kind string) fleetVerdict {
		var rs []fleetRow
		for _, r := range rows {
			if r.Kind == kind {
				rs = append(rs, r)
			}
		}
		return fleetJudge(rows, rs[0].groupKey(), rs)
	}
	bare := func(trigger string, trig ...float64) []fleetRow {
		var rows []fleetRow
		for i, v := range trig {
			rows = append(rows, fleetTestRow(trigger, uint64(i+1), "bare", v, 0, 0))
		}
		return rows
	}
	lib := func(trigger string, f func(seed uint64) (trig, rec, wasted float64)) []fleetRow {
		var rows []fleetRow
		for seed := uint64(1); seed <= 3; seed++ {
			trig, rec, wasted := f(seed)
			rows = append(rows, fleetTestRow(trigger, seed, "resilience", trig, rec, wasted))
		}
		return rows
	}

	v := judge(append(bare("slow2.5x", 98, 99, 97), lib("slow2.5x", func(uint64) (float64, float64, float64) { return 97, 0, 1 })...), "resilience")
	assert.True(t, v.judged)
	assert.Empty(t, v.misses, "97 ≥ 90 and ≥ bare's median 98 − 2")
	assert.Equal(t, 3, v.seedsMet)
	assert.Equal(t, 3, v.seedsJudged)
	assert.Contains(t, v.String(), "met")

	v = judge(append(bare("slow2.5x", 98, 99, 97), lib("slow2.5x", func(uint64) (float64, float64, float64) { return 95, 0, 1 })...), "resilience")
	assert.Equal(t, []string{"trigger 95 < bare 98 − 2"}, v.misses)
	assert.Equal(t, 1, v.seedsMet, "seed 3 alone: 95 ≥ 97 − 2")

	v = judge(append(bare("slow2.5x", 89, 89, 89), lib("slow2.5x", func(uint64) (float64, float64, float64) { return 89, 0, 1 })...), "resilience")
	assert.Equal(t, []string{"trigger 89 < 90"}, v.misses, "the floor holds whatever bare does")

	v = judge(append(bare("capacity/2", 96, 96, 96), lib("capacity/2", func(seed uint64) (float64, float64, float64) {
		if seed == 2 {
			return 96, math.Inf(1), 30
		}
		return 96, 2.5, 4
	})...), "resilience")
	assert.Equal(t, []string{"recovery 2.5s > 2s"}, v.misses, "recovery's median 2.5 s; wasted's 4 ≤ 5")
	assert.Zero(t, v.seedsMet)

	v = judge(append(bare("stall2s", 115, 118, 113), lib("stall2s", func(seed uint64) (float64, float64, float64) { return 112 + float64(seed), math.Inf(1), 50 })...), "resilience")
	assert.Empty(t, v.misses, "the stall is judged on after 4 s alone: median 114 ≥ 115 − 2")
	assert.Equal(t, 2, v.seedsMet, "seed 2: 114 < 118 − 2")

	rows := append(bare("slow2.5x", 98, 99, 97), lib("slow2.5x", func(uint64) (float64, float64, float64) { return 97, 0, 1 })...)
	rows[1].CalibPct = 98
	rows[5].LagP99 = 30 * time.Millisecond
	v = judge(rows, "resilience")
	assert.False(t, v.judged)
	assert.Contains(t, v.why, "seed 2: bare served 98.0 %")
	assert.Contains(t, v.why, "seed 3: resilience's calls started 30ms late")
	assert.Contains(t, v.String(), "not judged")

	v = judge(lib("slow2.5x", func(uint64) (float64, float64, float64) { return 97, 0, 1 }), "resilience")
	assert.False(t, v.judged, "no bare, no verdict")
}

// TestFleetResultsJSON checks that a results file keeps every figure,
// no figure (NaN) and never (+Inf) included, and that merging refuses a row
// twice and two timelines.
func TestFleetResultsJSON(t *testing.T) {
	r := fleetTestRow("stall2s", 1, "resilience+server", math.NaN(), math.Inf(1), 12.5)
	r.Behind, r.Server = true, fleetServerTotals{Expired: 1, RetryRefused: 2, Overloaded: 3, Stop: 3}
	res := fleetResults{Meta: fleetMeta{Before: 4 * time.Second, Trigger: 4 * time.Second, After: 12 * time.Second}, Rows: []fleetRow{r}}
	js, err := json.Marshal(res)
	require.NoError(t, err)
	var back fleetResults
	require.NoError(t, json.Unmarshal(js, &back))
	js2, err := json.Marshal(back)
	require.NoError(t, err)
	assert.JSONEq(t, string(js), string(js2))
	assert.True(t, math.IsNaN(float64(back.Rows[0].TrigPct)))
	assert.True(t, math.IsInf(float64(back.Rows[0].Recovery95), 1))
	assert.Equal(t, 12.5, float64(back.Rows[0].WastedPct))
	assert.Equal(t, r.Server, back.Rows[0].Server)

	_, err = fleetMerge([]fleetResults{res, back})
	assert.ErrorContains(t, err, "in two results")
	other := back
	other.Rows = []fleetRow{fleetTestRow("stall2s", 2, "resilience+server", 100, 0, 0)}
	rows, err := fleetMerge([]fleetResults{res, other})
	require.NoError(t, err)
	assert.Len(t, rows, 2)
	other.Meta.After = time.Second
	_, err = fleetMerge([]fleetResults{res, other})
	assert.ErrorContains(t, err, "timeline")
}
