// Command ratios reads `go test -bench` output of this module's benchmarks
// and prints Markdown tables of the medians, each peer's ratios to the bare
// peer measured in the same run, and whether the targets of issues 3 and 5
// are met.
//
//	go run ./cmd/ratios results/latest.txt
//
// Benchmarks are grouped by name without their "peer=" component; a group's
// bare peer is its baseline.
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

type group struct {
	name  string
	peers []string                        // in order of appearance
	vals  map[string]map[string][]float64 // peer -> unit -> samples
}

func (g *group) median(peer, unit string) (float64, bool) {
	v := slices.Clone(g.vals[peer][unit])
	if len(v) == 0 {
		return math.NaN(), false
	}
	slices.Sort(v)
	if n := len(v); n%2 == 1 {
		return v[n/2], true
	} else {
		return (v[n/2-1] + v[n/2]) / 2, true
	}
}

var procSuffix = regexp.MustCompile(`-\d+$`)

func parse(r io.Reader) ([]*group, error) {
	var groups []*group
	byName := map[string]*group{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		var rest []string
		peer := ""
		for _, part := range strings.Split(name, "/") {
			if p, ok := strings.CutPrefix(part, "peer="); ok {
				peer = p
			} else {
				rest = append(rest, part)
			}
		}
		if peer == "" && len(rest) > 1 {
			// No peer (the herd experiment): the last component, say
			// jitter=on, takes its place.
			peer, rest = rest[len(rest)-1], rest[:len(rest)-1]
		}
		if peer == "" {
			continue
		}
		gname := strings.Join(rest, "/")
		g := byName[gname]
		if g == nil {
			g = &group{name: gname, vals: map[string]map[string][]float64{}}
			byName[gname] = g
			groups = append(groups, g)
		}
		if g.vals[peer] == nil {
			g.vals[peer] = map[string][]float64{}
			g.peers = append(g.peers, peer)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", f[0], err)
			}
			g.vals[peer][f[i+1]] = append(g.vals[peer][f[i+1]], v)
		}
	}
	return groups, sc.Err()
}

func num(v float64, ok bool) string {
	if !ok {
		return "–"
	}
	switch {
	case v >= 100 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func signed(v float64) string {
	if v >= 0 {
		return "+" + num(v, true)
	}
	return "−" + num(-v, true)
}

const mib = 1 << 20

// experiment reports whether a group is not a time benchmark: its ns/op is
// not per request, so it has no place in the ratios table.
func experiment(name string) bool {
	for _, p := range []string{"BenchmarkPutMemory", "BenchmarkFaults", "BenchmarkHerd", "BenchmarkHedging", "BenchmarkRetryBudget", "BenchmarkPacing", "BenchmarkEndpointHedging"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func main() {
	in := io.Reader(os.Stdin)
	if len(os.Args) > 1 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer f.Close()
		in = f
	}
	groups, err := parse(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	find := func(name string) *group {
		for _, g := range groups {
			if g.name == name {
				return g
			}
		}
		return nil
	}

	fmt.Println("| benchmark | peer | ns/op | B/op | allocs/op | time × bare | added ns/op | added allocs/op | samples |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, g := range groups {
		if experiment(g.name) {
			continue
		}
		bns, _ := g.median("bare", "ns/op")
		ballocs, _ := g.median("bare", "allocs/op")
		for _, p := range g.peers {
			ns, ok := g.median(p, "ns/op")
			b, bok := g.median(p, "B/op")
			a, aok := g.median(p, "allocs/op")
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", g.name, p,
				num(ns, ok), num(b, bok), num(a, aok),
				strconv.FormatFloat(ns/bns, 'f', 2, 64), signed(ns-bns), signed(a-ballocs),
				len(g.vals[p]["ns/op"]))
		}
	}

	fmt.Println()
	fmt.Println("| 64 MiB PUT | peer | peak heap growth (MiB) | allocated B/op (MiB) | MB/s |")
	fmt.Println("|---|---|---:|---:|---:|")
	for _, g := range groups {
		if !strings.HasPrefix(g.name, "BenchmarkPutMemory") {
			continue
		}
		for _, p := range g.peers {
			peak, ok := g.median(p, "peak-heap-B")
			b, bok := g.median(p, "B/op")
			mbs, mok := g.median(p, "MB/s")
			fmt.Printf("| %s | %s | %s | %s | %s |\n", strings.TrimPrefix(g.name, "BenchmarkPutMemory/"), p,
				num(peak/mib, ok), num(b/mib, bok), num(mbs, mok))
		}
	}

	faults := false
	for _, g := range groups {
		if !strings.HasPrefix(g.name, "BenchmarkFaults/") {
			continue
		}
		if !faults {
			faults = true
			fmt.Println()
			fmt.Println("| faults | peer | success % | p50 ms | p99 ms | attempts/req | new conns | goroutines left | circuit opens | failed: status / timeout / circuit open / other |")
			fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
		}
		for _, p := range g.peers {
			m := func(unit string) string { return num(g.median(p, unit)) }
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s / %s |\n",
				strings.TrimPrefix(g.name, "BenchmarkFaults/"), p,
				m("success-%"), m("p50-ms"), m("p99-ms"), m("attempts/req"), m("new-conns"),
				m("goroutines-left"), m("circuit-opens"),
				m("fail-status"), m("fail-timeout"), m("fail-open"), m("fail-other"))
		}
	}

	if g := find("BenchmarkHerd"); g != nil {
		fmt.Println()
		fmt.Printf("| herd (%d rounds, medians) | peak retries / 25 ms | burst ratio, outage, 25 ms | burst ratio, retry period, 25 ms | peak retries / 100 ms | burst ratio, outage, 100 ms | attempts | last attempt ms | instances ok |\n",
			len(g.vals[g.peers[0]]["attempts"]))
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, p := range g.peers {
			m := func(unit string) string { return num(g.median(p, unit)) }
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p,
				m("peak-25ms"), m("burst-25ms"), m("burst-period-25ms"), m("peak-100ms"), m("burst-100ms"),
				m("attempts"), m("last-ms"), m("ok"))
		}
		on, _ := g.median("jitter=on", "peak-25ms")
		off, _ := g.median("jitter=off", "peak-25ms")
		bon, _ := g.median("jitter=on", "burst-25ms")
		boff, _ := g.median("jitter=off", "burst-25ms")
		fmt.Printf("\nHerd: peak retries in one 25 ms window of the outage, no jitter / jitter = %s / %s = %.2f; burst ratio %.2f without jitter, %.2f with.\n",
			num(off, true), num(on, true), off/on, boff, bon)
	}

	hedging := false
	for _, g := range groups {
		if !strings.HasPrefix(g.name, "BenchmarkHedging/") {
			continue
		}
		if !hedging {
			hedging = true
			fmt.Println()
			fmt.Println("| hedging | peer | p50 ms | p90 ms | p95 ms | p99 ms | max ms | attempts/req | hedges | budget refused | losers | cancelled | new conns | goroutines left | failed |")
			fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		}
		for _, p := range g.peers {
			m := func(unit string) string { return num(g.median(p, unit)) }
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				strings.TrimPrefix(g.name, "BenchmarkHedging/"), p,
				m("p50-ms"), m("p90-ms"), m("p95-ms"), m("p99-ms"), m("max-ms"), m("attempts/req"),
				m("hedges"), m("budget-refused"), m("losers"), m("cancelled"), m("new-conns"),
				m("goroutines-left"), m("failed"))
		}
	}

	budget := false
	for _, g := range groups {
		if !strings.HasPrefix(g.name, "BenchmarkRetryBudget/") {
			continue
		}
		if !budget {
			budget = true
			fmt.Println()
			fmt.Println("| retry budget | peer | attempts/req | retries | budget exceeded | circuit opens | calls: 200 / 503 / circuit open / other | p50 ms | p99 ms | wall ms |")
			fmt.Println("|---|---|---:|---:|---:|---:|---|---:|---:|---:|")
		}
		for _, p := range g.peers {
			m := func(unit string) string { return num(g.median(p, unit)) }
			wall, ok := g.median(p, "ns/op")
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s / %s / %s / %s | %s | %s | %s |\n",
				strings.TrimPrefix(g.name, "BenchmarkRetryBudget/"), p,
				m("attempts/req"), m("retries"), m("budget-exceeded"), m("circuit-opens"),
				m("got-200"), m("got-503"), m("circuit-open"), m("other"), m("p50-ms"), m("p99-ms"), num(wall/1e6, ok))
		}
	}

	fmt.Println()
	fmt.Println("Targets (resilience = standard handler, zero Options; medians):")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	for _, name := range []string{"BenchmarkOverhead", "BenchmarkOverheadParallel"} {
		g := find(name)
		if g == nil {
			continue
		}
		bns, _ := g.median("bare", "ns/op")
		ba, _ := g.median("bare", "allocs/op")
		rns, _ := g.median("resilience", "ns/op")
		ra, _ := g.median("resilience", "allocs/op")
		fns, _ := g.median("failsafehttp", "ns/op")
		added, fadded := rns-bns, fns-bns
		fmt.Printf("- %s: added allocs %s (target ≤ 12): %s; added time %s ns vs failsafehttp's %s ns = %.2f of it (target ≤ 0.33): %s\n",
			name, signed(ra-ba), verdict(ra-ba <= 12), signed(added), signed(fadded), added/fadded, verdict(added <= fadded/3))
	}
	for _, name := range []string{"BenchmarkLoopback/conc=1", "BenchmarkLoopback/conc=16"} {
		g := find(name)
		if g == nil {
			continue
		}
		bns, _ := g.median("bare", "ns/op")
		rns, _ := g.median("resilience", "ns/op")
		fmt.Printf("- %s: resilience %.3f × bare (target ≤ 1.05): %s\n", name, rns/bns, verdict(rns/bns <= 1.05))
	}
	for _, t := range []struct {
		body  string
		limit float64
	}{{"getbody", 2 * mib}, {"reader", 2 * mib}, {"reader-sized", 2 * mib}} {
		g := find("BenchmarkPutMemory/body=" + t.body)
		if g == nil {
			continue
		}
		peak, _ := g.median("resilience", "peak-heap-B")
		fmt.Printf("- 64 MiB PUT, body=%s: peak heap growth %.2f MiB (target < %.0f MiB): %s\n",
			t.body, peak/mib, t.limit/mib, verdict(peak < t.limit))
	}
	if g := find("BenchmarkFaults/mix=flaky"); g != nil {
		succ, _ := g.median("resilience", "success-%")
		left, _ := g.median("resilience", "goroutines-left")
		conns, _ := g.median("resilience", "new-conns")
		best, bestPeer := 0.0, ""
		fewest, fewestPeer := math.Inf(1), ""
		for _, p := range g.peers {
			if p == "resilience" {
				continue
			}
			if v, _ := g.median(p, "success-%"); v > best {
				best, bestPeer = v, p
			}
			if v, _ := g.median(p, "new-conns"); p != "bare" && v < fewest {
				fewest, fewestPeer = v, p
			}
		}
		fmt.Printf("- Faults, mix=flaky (no numeric target in issue 3): resilience success %.2f %% (best peer %s %.2f %%); new connections %.0f (fewest of the retrying peers: %s %.0f); goroutines left %.0f (want 0): %s\n",
			succ, bestPeer, best, conns, fewestPeer, fewest, left, verdict(left == 0))
	}
	for _, g := range groups {
		if !strings.HasPrefix(g.name, "BenchmarkHedging/") {
			continue
		}
		sp99, sok := g.median("standard", "p99-ms")
		hp99, hok := g.median("hedging", "p99-ms")
		att, aok := g.median("hedging", "attempts/req")
		if !sok || !hok || !aok {
			continue
		}
		losers, _ := g.median("hedging", "losers")
		cancelled, _ := g.median("hedging", "cancelled")
		left, _ := g.median("hedging", "goroutines-left")
		fmt.Printf("- Hedging, %s (issue 5): p99 %s ms with hedging vs %s ms without = %.2f (target < 0.50): %s; %.3f attempts/req (target ≤ 1.3): %s; losers cancelled %.0f of %.0f, goroutines left %.0f (want 0): %s",
			strings.TrimPrefix(g.name, "BenchmarkHedging/"), num(hp99, true), num(sp99, true), hp99/sp99,
			verdict(hp99 < sp99/2), att, verdict(att <= 1.3), cancelled, losers, left, verdict(left == 0 && cancelled == losers))
		if np99, ok := g.median("hedging-nobudget", "p99-ms"); ok {
			natt, _ := g.median("hedging-nobudget", "attempts/req")
			fmt.Printf(" (without the retry budget: p99 %s ms = %.2f, %.3f attempts/req)", num(np99, true), np99/sp99, natt)
		}
		fmt.Println()
	}
	if g := find("BenchmarkRetryBudget/upstream=down/breaker=off"); g != nil {
		with, _ := g.median("budget", "attempts/req")
		without, _ := g.median("nobudget", "attempts/req")
		refused, _ := g.median("budget", "budget-exceeded")
		fmt.Printf("- Retry budget, 64 clients, upstream always 503, breaker off (issue 5): %.3f attempts/req with the budget (target ≤ 1.3): %s; %.3f without (expected 4.0): %s; %.0f EventBudgetExceeded\n",
			with, verdict(with <= 1.3), without, verdict(math.Abs(without-4) < 0.005), refused)
	}
	if g := find("BenchmarkRetryBudget/upstream=flaky/breaker=off"); g != nil {
		refused, _ := g.median("budget", "budget-exceeded")
		retries, _ := g.median("nobudget", "retries")
		failed, _ := g.median("budget", "got-503")
		fmt.Printf("- Retry budget, 64 clients, 1 request in 20 fails (issue 5: the budget does not bite at low failure rates): %.0f of the %.0f retries needed refused, %.0f calls failed that would have succeeded without it: %s\n",
			refused, retries, failed, verdict(refused == 0))
	}
}
