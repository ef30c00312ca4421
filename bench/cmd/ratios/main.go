// Command ratios reads `go test -bench` output of this module's benchmarks
// and prints Markdown tables of the medians, each peer's ratios to the bare
// peer measured in the same run, and whether the targets of issue 3 are met.
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
	for _, p := range []string{"BenchmarkPutMemory", "BenchmarkFaults", "BenchmarkHerd"} {
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
}
