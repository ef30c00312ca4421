package overload

import (
	"math"
	"testing"
	"time"
)

// feed gives g n samples of rtt spread over d from *now, sent with k in
// flight, and returns the limit.
func feed(g *gradient, now *time.Time, n int, d, rtt time.Duration, k int, full bool) float64 {
	for range n {
		*now = now.Add(d / time.Duration(n))
		g.sample(*now, rtt, k, full)
	}
	return g.limit
}

func TestGradientGrowsWhileLatencyHolds(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(8, 1000, 20, now)
	for range 30 {
		feed(g, &now, 100, time.Second, 20*time.Millisecond, 15, false)
	}
	if g.limit <= 20 || g.limit > 15*gradientHeadroom {
		t.Fatalf("limit %v: want grown above 20, at most %d", g.limit, 15*gradientHeadroom)
	}
}

func TestGradientFallsWhenLatencyRises(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(8, 1000, 40, now)
	for range 20 {
		feed(g, &now, 100, time.Second, 20*time.Millisecond, 30, false)
	}
	before := g.limit
	for range 10 {
		feed(g, &now, 100, time.Second, 50*time.Millisecond, int(g.limit), true)
	}
	if g.limit >= before {
		t.Fatalf("limit %v after latency x2.5: want under %v", g.limit, before)
	}
}

func TestGradientWaitsForSamples(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(8, 1000, 20, now)
	feed(g, &now, gradientMinSamples-1, 10*time.Second, time.Millisecond, 20, false)
	if g.nMedians != 0 {
		t.Fatalf("a window closed with %d samples", gradientMinSamples-1)
	}
}

func TestCorrelation(t *testing.T) {
	c := newCorrelation(50)
	var r float64
	for i := range 40 {
		x := float64(i%7 + 1)
		r, _, _ = c.add(x, 3*x+1)
	}
	if math.Abs(r-1) > 1e-9 {
		t.Fatalf("correlation of y = 3x+1: %v, want 1", r)
	}
}

// A limit that holds attempts back while the latency stays at its baseline
// is what bounds them: it doubles each window, as TCP's slow start does,
// rather than growing a step a window.
func TestGradientSlowStartWhileTheLimitBinds(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(8, 1000, 20, now)
	for range 5 {
		feed(g, &now, 100, time.Second, 100*time.Millisecond, int(g.limit), true)
	}
	if g.limit < 100 {
		t.Fatalf("limit %v after 5 windows held full at a flat latency: want at least 100", g.limit)
	}
}

// A window slower than the baseline stops the doubling at once, before
// the median and the average smooth the rise in.
func TestGradientSlowStartStopsWhenLatencyRises(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(8, 1000, 20, now)
	for range 12 {
		feed(g, &now, 100, time.Second, 20*time.Millisecond, 15, false)
	}
	before := g.limit
	for range 3 {
		feed(g, &now, 100, time.Second, 50*time.Millisecond, int(g.limit), true)
	}
	if g.limit > before+3 {
		t.Fatalf("limit %v after 3 slower windows: want at most %v", g.limit, before+3)
	}
}

// In slow start a window lasts two round trips, not a second: a limit held
// full at a flat latency of 100 ms passes 100 within a second and a half.
func TestGradientSlowStartWindowsAreRoundTrips(t *testing.T) {
	now := time.Unix(0, 0)
	start := now
	g := newGradient(8, 1000, 20, now)
	for g.limit < 100 && now.Sub(start) < 10*time.Second {
		// 20 samples each 10 ms: the limit's attempts answered in 100 ms
		feed(g, &now, 20, 10*time.Millisecond, 100*time.Millisecond, int(g.limit), true)
	}
	if d := now.Sub(start); d > 1500*time.Millisecond {
		t.Fatalf("the limit reached %v after %v: want 100 within 1.5s", g.limit, d)
	}
}
