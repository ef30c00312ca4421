package resilience

import (
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLatencyBucketBounds(t *testing.T) {
	for _, us := range []uint64{0, 1, 7, 8, 9, 15, 16, 100, 999, 1000, 12345, 1 << 20, 3e7} {
		b := latencyBucket(us)
		require.Less(t, us, latencyUpper(b), "bucket %d of %dµs", b, us)
		if b > 0 {
			require.GreaterOrEqual(t, us, latencyUpper(b-1), "bucket %d of %dµs", b, us)
		}
		assert.LessOrEqual(t, float64(latencyUpper(b)), float64(us)*1.125+1, "at most 12.5%% above")
	}
	assert.Equal(t, latencyBuckets-1, latencyBucket(1<<40), "clamped to the last bucket")
}

// The sketch's percentile is never below the true one and at most 12.5%
// above it.
func TestLatencySketchPercentile(t *testing.T) {
	l := &latencySketch{epoch: time.Now()}
	_, ok := l.percentile(0.95)
	assert.False(t, ok, "no samples yet")
	var ds []time.Duration
	for i := range 1000 {
		d := time.Duration(1+i%200) * time.Millisecond
		if i%10 == 0 {
			d = time.Second
		}
		ds = append(ds, d)
		l.record(d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	for _, p := range []float64{0.5, 0.8, 0.95} {
		l.at.Store(0) // no cache
		got, ok := l.percentile(p)
		require.True(t, ok)
		want := ds[int(p*float64(len(ds)))-1]
		assert.GreaterOrEqual(t, got, want, "p%v", p)
		assert.LessOrEqual(t, float64(got), float64(want)*1.125+float64(time.Microsecond), "p%v", p)
	}
}

func TestLatencySketchAllocs(t *testing.T) {
	l := &latencySketch{epoch: time.Now()}
	assert.Zero(t, testing.AllocsPerRun(1000, func() { l.record(3 * time.Millisecond) }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { l.at.Store(0); l.percentile(0.95) }))
}

func BenchmarkLatencySketchRecord(b *testing.B) {
	l := &latencySketch{epoch: time.Now()}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.record(time.Duration(i%5000) * time.Microsecond)
	}
}

func BenchmarkLatencySketchPercentile(b *testing.B) {
	l := &latencySketch{epoch: time.Now()}
	for i := range 10000 {
		l.record(time.Duration(i%5000) * time.Microsecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		l.at.Store(0) // recompute every time: the uncached cost
		l.percentile(0.95)
	}
}

// The cap holds exactly within a window: of 1000 calls that each ask for a
// hedge, 5% plus the reserve of one get it.
func TestExtraLoadClaim(t *testing.T) {
	w := &extraLoad{epoch: time.Now()}
	granted := 0
	for range 1000 {
		w.call()
		if w.claim(0.05) {
			granted++
		}
	}
	assert.Equal(t, 51, granted)
}

// Against an upstream that is uniformly slow (every answer after 20ms,
// Delay 1ms), every call wants a hedge; MaxExtraLoad holds them to its
// share, and the refusals are reported once per call.
func TestHedgeMaxExtraLoadUniformlySlow(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	rec := &evRecorder{}
	tr, err := NewHedgingTransport(&http.Transport{}, Options{
		Hedging: HedgingOptions{Delay: time.Millisecond, MaxExtraLoad: 0.1},
		OnEvent: rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	const calls, workers = 200, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls / workers {
				routedGet(t, tr, up.URL+"/"+string(rune('a'+w)))
			}
		}()
	}
	wg.Wait()
	hedges := len(rec.of(EventHedge))
	assert.LessOrEqual(t, hedges, calls/10+1, "at most MaxExtraLoad of the calls, plus one")
	assert.Positive(t, hedges)
	capped := rec.of(EventHedgeCapped)
	// Once per call at most: a call refused at one hedge point may be
	// granted its hedge at a later one, when other calls have made room.
	assert.LessOrEqual(t, len(capped), calls)
	assert.GreaterOrEqual(t, len(capped), calls-hedges, "every call that got no hedge says so")
}

// With DelayPercentile, the delay follows the latencies seen, within the
// floor and the ceiling; Delay applies until enough attempts were seen.
func TestHedgeDelayPercentile(t *testing.T) {
	h, err := NewHandler(Options{Hedging: HedgingOptions{Enabled: true, Delay: time.Second, DelayPercentile: 0.9, MinDelay: 5 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
	require.NoError(t, err)
	c := &call{h: h, cfg: h.cfg.Load()}
	assert.Equal(t, time.Second, c.hedgeDelay(), "too few attempts seen: Delay")
	for i := range 200 {
		h.latency.record(time.Duration(i%100) * 100 * time.Microsecond) // 0 to 9.9ms
	}
	h.latency.at.Store(0)
	d := c.hedgeDelay()
	assert.GreaterOrEqual(t, d, 9*time.Millisecond)
	assert.LessOrEqual(t, d, 11*time.Millisecond)
	for range 1000 {
		h.latency.record(time.Minute)
	}
	h.latency.at.Store(0)
	assert.Equal(t, 500*time.Millisecond, c.hedgeDelay(), "the ceiling")
}
