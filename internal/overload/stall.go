package overload

import (
	"runtime/metrics"
	"sync"
	"time"
)

// A stallMeter tells the process's own stalls from the upstream's
// slowness. The time to headers is read on the client: when the client
// cannot run (its goroutines wait for a P, its threads for a CPU, its
// collector runs), every answer looks late, and the upstream is not to
// blame. It has two views of the process:
//
//   - the Go scheduler's (stalled): how long runnable goroutines waited to
//     run (runtime/metrics, /sched/latencies:seconds), one read costing
//     about 200 ns. It sees goroutines starve one another (GOMAXPROCS 1
//     and busy goroutines), but not the operating system starving the
//     whole process: a goroutine whose thread waits for a CPU is running
//     as far as the runtime knows;
//   - the operating system's, on Linux (starved): how long the process's
//     threads waited for a CPU while runnable, and ran on one (the
//     kernel's scheduler statistics, cpuTimes), one read costing 60-200
//     µs (a few milliseconds when the process is starved while it reads),
//     so made at most once every cpuSpan.
//
// The meter is read only when the limiter is about to shed a retry, an
// attempt would wait for a slot or one timed out, and the scheduler's view
// once a second while attempts are answered (Limiter.sampleLocked), so
// that a look has a recent base. What the limiter does with it:
// Limiter.stalledLocked, and for the operating system's view, which only
// the sluggish rule reads, Limiter.sluggishLocked.
//
// Measured in BenchmarkFleetNoHarm's starved probe (the client at
// GOMAXPROCS 1 with busy goroutines for 4 s, a healthy upstream): without
// the meter the limiter shed 8 retries of calls that a client with the
// limiter off served, because the answers of the starved seconds came
// several times slower than usual. With the scheduler's view alone, an
// in-memory upstream (nothing on the other side to be slow) called by a
// client beside 3 to 16 processes spinning on 2 cores had 4 to 34 calls
// of 100,000-200,000 end shed, and none with both (bench/starved_test.go,
// issue 47).
type stallMeter struct {
	mu      sync.Mutex
	sample  [1]metrics.Sample
	counts  []uint64  // the histogram's counts at the last look
	lookAt  time.Time // the last look
	stallAt time.Time // the last look that saw a stall

	// cpu reads the threads' times (cpuTimes; a test's stub when not nil)
	cpu         func() (waited, ran time.Duration, ok bool)
	cpuAt       time.Time     // the last read that had them; zero: none yet
	waited, ran time.Duration // what it read
	starvedAt   time.Time     // the last read that saw the process starved
}

// stallMemory is how long a stall is remembered: the answers slowed by it
// are in the recent time to headers for a few samples after it ends.
const stallMemory = time.Second

// stallShare is the share of the goroutines scheduled since the last look
// that must have waited over the line for the process to have stalled:
// the 99th percentile.
const stallShare = 0.01

// newStallMeter returns a meter whose first look compares with now: a
// Handler's limiter takes its bases when it is built, not at its first
// look, which would otherwise only take one.
func newStallMeter(now time.Time) *stallMeter {
	m := new(stallMeter)
	m.stalled(now, stallMemory)
	m.starved(now)
	return m
}

// stalled reports whether the process's goroutines waited more than d to
// run lately (scheduledLocked).
func (m *stallMeter) stalled(now time.Time, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.scheduledLocked(now, d)
}

// look is stalled for a base: its cost is small enough to pay once a
// second on the path of an answer.
func (m *stallMeter) look(now time.Time, d time.Duration) {
	m.stalled(now, d)
}

// starved reports whether the operating system starved the process's
// threads of a CPU lately (starvedLocked).
func (m *stallMeter) starved(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.starvedLocked(now)
}

// scheduledLocked reports whether the process's goroutines waited more than
// d to run, 1 in 100 of them or more, since the meter's last look, or did
// so at a look within stallMemory before now.
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
func (m *stallMeter) scheduledLocked(now time.Time, d time.Duration) bool {
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

// cpuSpan is the least time between two reads of the threads' times: a
// read costs 60-200 µs, and over a shorter span one thread's wait for a
// CPU on waking, a millisecond or more on a busy machine, can be most of
// the span. A look within cpuSpan of the last read answers from what
// that read saw.
const cpuSpan = 20 * time.Millisecond

// starvedLocked reports whether the operating system starved the process
// lately: since the meter's last read of its threads' times (cpuSpan ago
// at least), the threads waited for a CPU while runnable, together, for
// half that time or more, and for half as long as they ran or more; or a
// read within stallMemory before now saw that.
//
// Each condition has its reason. Waiting half as long as they ran or
// more, the client's own work took one and a half times as long as on a
// free CPU or more; a busy client on a machine only a little busier waits
// less. Waiting half the time or more, together, it is not an idle client
// whose few wake-ups each wait a while for a CPU on a busy machine:
// waiting for a sluggish upstream on a machine at load 7, such a client's
// threads waited 1-7 % of the time (if up to three times as long as they
// ran), where, starved beside 2 to 8 spinning processes on 2 cores, they
// waited 1 to 4 times the time, and 3 to 100 times as long as they ran
// (bench/starved_test.go).
//
// Unlike the scheduler's histogram, these are shares of the time between
// two reads, whatever its length: a stall long over is diluted by the
// time since, not mistaken for a stall now, so a read long after the last
// one (the base taken when the meter was made) is judged as any other.
func (m *stallMeter) starvedLocked(now time.Time) bool {
	if m.cpuAt.IsZero() || now.Sub(m.cpuAt) >= cpuSpan {
		read := m.cpu
		if read == nil {
			read = cpuTimes
		}
		waited, ran, ok := read()
		switch {
		case !ok:
			m.cpuAt = time.Time{} // nothing to compare the next read with
		case !m.cpuAt.IsZero() && waited >= m.waited && ran >= m.ran: // a thread that exited takes its times with it: then only a base
			w, r, span := waited-m.waited, ran-m.ran, now.Sub(m.cpuAt)
			if 2*w >= span && 2*w >= r {
				m.starvedAt = now
			}
			fallthrough
		default:
			m.cpuAt, m.waited, m.ran = now, waited, ran
		}
	}
	return !m.starvedAt.IsZero() && now.Sub(m.starvedAt) < stallMemory
}
