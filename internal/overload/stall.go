package overload

import (
	"runtime/metrics"
	"sync"
	"time"
)

// A stallMeter tells the process's own stalls from the upstream's
// slowness. The time to headers is read on the client: when the client's
// goroutines wait for a CPU (its CPU starved, its collector running),
// every answer looks late, and the upstream is not to blame. The Go
// runtime knows how long runnable goroutines waited to run
// (runtime/metrics, /sched/latencies:seconds); the meter reads it only
// when the limiter is about to shed a retry, an attempt would wait for a
// slot or one timed out, one read costing about 200 ns. What the limiter
// does with it: Limiter.stalledLocked.
//
// Measured in BenchmarkFleetNoHarm's starved probe (the client at
// GOMAXPROCS 1 with busy goroutines for 4 s, a healthy upstream): without
// the meter the limiter shed 8 retries of calls that a client with the
// limiter off served, because the answers of the starved seconds came
// several times slower than usual.
type stallMeter struct {
	mu      sync.Mutex
	sample  [1]metrics.Sample
	counts  []uint64  // the histogram's counts at the last look
	lookAt  time.Time // the last look
	stallAt time.Time // the last look that saw a stall
}

// stallMemory is how long a stall is remembered: the answers slowed by it
// are in the recent time to headers for a few samples after it ends.
const stallMemory = time.Second

// stallShare is the share of the goroutines scheduled since the last look
// that must have waited over the line for the process to have stalled:
// the 99th percentile.
const stallShare = 0.01

// stalled reports whether the process's goroutines waited more than d to
// run, 1 in 100 of them or more, since the meter's last look, or did so
// at a look within stallMemory before now.
//
// A look more than stallMemory after the last one (or the first) only
// takes the counts as its base: the histogram cannot say when in that time
// its goroutines waited, and a stall long over is not the reason for an
// attempt's slowness now. Compared with the process's start instead, the
// first look of every Handler built after a busy minute said "stalled"
// and the limiter sent over its limit for a second: in the fleet
// experiment, runs after go-retryablehttp's (whose 14,000 dead requests
// kept the process busy) had ten replicas hold 500 attempts at the
// upstream through a 2 s stall where their limits allowed 200.
func (m *stallMeter) stalled(now time.Time, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sample[0].Name = "/sched/latencies:seconds"
	metrics.Read(m.sample[:])
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return false // a runtime without the metric: the latency is the upstream's
	}
	h := m.sample[0].Value.Float64Histogram()
	stale := len(m.counts) != len(h.Counts) || now.Sub(m.lookAt) > stallMemory
	m.lookAt = now
	if stale {
		m.counts = append(m.counts[:0], h.Counts...)
		return !m.stallAt.IsZero() && now.Sub(m.stallAt) < stallMemory
	}
	line := d.Seconds()
	var all, over uint64
	for i, c := range h.Counts {
		n := c - m.counts[i]
		m.counts[i] = c
		all += n
		if h.Buckets[i] >= line { // the bucket's lower bound: every sample in it waited that long
			over += n
		}
	}
	if all > 0 && float64(over) >= stallShare*float64(all) {
		m.stallAt = now
	}
	return !m.stallAt.IsZero() && now.Sub(m.stallAt) < stallMemory
}
