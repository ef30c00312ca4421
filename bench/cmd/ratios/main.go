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

	fmt.Println("| benchmark | peer | ns/op | B/op | allocs/op | time × bare | added ns/op | added allocs/op | samples |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, g := range groups {
		if strings.HasPrefix(g.name, "BenchmarkPutMemory") {
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

	fmt.Println()
	fmt.Println("Targets (resilience = standard handler, zero Options; medians):")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	find := func(name string) *group {
		for _, g := range groups {
			if g.name == name {
				return g
			}
		}
		return nil
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
}
