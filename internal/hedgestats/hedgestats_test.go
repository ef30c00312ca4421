package hedgestats

import (
	"sort"
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
func TestSketchPercentile(t *testing.T) {
	l := &Sketch{epoch: time.Now()}
	_, ok := l.Percentile(0.95)
	assert.False(t, ok, "no samples yet")
	var ds []time.Duration
	for i := range 1000 {
		d := time.Duration(1+i%200) * time.Millisecond
		if i%10 == 0 {
			d = time.Second
		}
		ds = append(ds, d)
		l.Record(d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	for _, p := range []float64{0.5, 0.8, 0.95} {
		l.at.Store(0) // no cache
		got, ok := l.Percentile(p)
		require.True(t, ok)
		want := ds[int(p*float64(len(ds)))-1]
		assert.GreaterOrEqual(t, got, want, "p%v", p)
		assert.LessOrEqual(t, float64(got), float64(want)*1.125+float64(time.Microsecond), "p%v", p)
	}
}

func TestSketchAllocs(t *testing.T) {
	l := &Sketch{epoch: time.Now()}
	assert.Zero(t, testing.AllocsPerRun(1000, func() { l.Record(3 * time.Millisecond) }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { l.at.Store(0); l.Percentile(0.95) }))
}

func BenchmarkSketchRecord(b *testing.B) {
	l := &Sketch{epoch: time.Now()}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.Record(time.Duration(i%5000) * time.Microsecond)
	}
}

func BenchmarkSketchPercentile(b *testing.B) {
	l := &Sketch{epoch: time.Now()}
	for i := range 10000 {
		l.Record(time.Duration(i%5000) * time.Microsecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		l.at.Store(0) // recompute every time: the uncached cost
		l.Percentile(0.95)
	}
}

// The cap holds exactly within a window: of 1000 calls that each ask for a
// hedge, 5% plus the reserve of one get it.
func TestExtraLoadClaim(t *testing.T) {
	w := &ExtraLoad{epoch: time.Now()}
	granted := 0
	for range 1000 {
		w.Call()
		if w.Claim(0.05) {
			granted++
		}
	}
	assert.Equal(t, 51, granted)
}
