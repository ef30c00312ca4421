package overload

import (
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The meter sees the process's own stall: with one P and two goroutines
// that never block, a goroutine that wakes from a sleep waits for the
// scheduler to preempt one of them (every 10 ms), far over a line of 1 ms;
// and it remembers the stall for stallMemory.
func TestStallMeterSeesTheProcessStarved(t *testing.T) {
	m := schedulerOnly()
	m.stalled(time.Now(), time.Millisecond) // the baseline

	starveProcess()

	now := time.Now()
	assert.True(t, m.stalled(now, time.Millisecond), "sleepers waited for busy goroutines to be preempted")
	assert.True(t, m.stalled(now.Add(stallMemory/2), time.Hour), "remembered")
	assert.False(t, m.stalled(now.Add(stallMemory), time.Hour), "forgotten after stallMemory, nothing waited an hour")
}

// Issue 31: a look long after the last cannot say when its goroutines
// waited; it takes the counts as its base and says nothing. Compared with
// the process's start, every Handler built after a busy minute read
// "stalled" at its first look.
func TestStallMeterForgetsAStallBeforeItsLastLook(t *testing.T) {
	starveProcess()
	first := schedulerOnly()
	now := time.Now()
	assert.False(t, first.stalled(now, time.Millisecond), "a first look: the stall before it is the process's past")
	assert.False(t, first.stalled(now.Add(time.Millisecond), time.Hour), "nor did that look remember one (nothing waited an hour)")

	m := schedulerOnly()
	m.stalled(now, time.Millisecond) // the base
	starveProcess()
	later := now.Add(stallMemory + time.Millisecond)
	assert.False(t, m.stalled(later, time.Millisecond), "the last look was over stallMemory ago: when the goroutines waited is unknown")
	assert.False(t, m.stalled(later.Add(time.Millisecond), time.Hour), "nor did that look remember one")
	starveProcess()
	assert.True(t, m.stalled(later.Add(2*time.Millisecond), time.Millisecond), "a stall since a recent look is seen")
}

// schedulerOnly is a stall meter with the Go scheduler's view alone: what
// the operating system does to the test process is not these tests'.
func schedulerOnly() *stallMeter {
	return &stallMeter{cpu: func() (time.Duration, time.Duration, bool) { return 0, 0, false }}
}

// Issue 47: the meter's view of the operating system, from the threads'
// times (here a stub's). The process is starved when its threads waited
// for a CPU half the time since the last read or more, together, and half
// as long as they ran or more; reads are cpuSpan apart at least, and a
// starvation is remembered for stallMemory. The scheduler's view is
// another, which reads none of it.
func TestStallMeterReadsTheThreadsWaitsForACPU(t *testing.T) {
	var waited, ran time.Duration
	ok, reads := true, 0
	m := &stallMeter{cpu: func() (time.Duration, time.Duration, bool) { reads++; return waited, ran, ok }}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	assert.False(t, m.starved(at(0)), "a first read is a base")
	waited, ran = 60*time.Millisecond, 100*time.Millisecond
	assert.False(t, m.starved(at(cpuSpan-time.Millisecond)), "within cpuSpan of the last read: not read")
	assert.Equal(t, 1, reads)
	assert.True(t, m.starved(at(100*time.Millisecond)), "waited 60 % of 100 ms, 60 % as long as it ran: starved")
	assert.Equal(t, 2, reads)
	assert.True(t, m.starved(at(600*time.Millisecond)), "remembered, though it waited no more")
	assert.False(t, m.starved(at(1100*time.Millisecond)), "forgotten after stallMemory")

	waited += 20 * time.Millisecond // a sleeper's wake-ups, each waiting a while on a busy machine
	ran += 2 * time.Millisecond
	assert.False(t, m.starved(at(1200*time.Millisecond)), "waited 10 times as long as it ran, but 20 % of the time: an idle client")
	waited += 60 * time.Millisecond // two busy threads, a little slower than on free CPUs
	ran += 200 * time.Millisecond
	assert.False(t, m.starved(at(1300*time.Millisecond)), "waited 60 % of the time, but 30 % as long as it ran")

	waited, ran = 0, 0 // threads exited, taking their times with them
	assert.False(t, m.starved(at(1400*time.Millisecond)), "less than the last read: only a base")
	waited, ran = 90*time.Millisecond, 10*time.Millisecond
	assert.True(t, m.starved(at(1500*time.Millisecond)), "compared with that base")

	ok = false
	assert.False(t, m.starved(at(2600*time.Millisecond)), "unreadable")
	ok, waited, ran = true, time.Second, time.Millisecond
	assert.False(t, m.starved(at(2700*time.Millisecond)), "after an unreadable read, a base")

	reads = 0
	m.stalled(time.Now(), time.Millisecond) // its base
	starveProcess()
	assert.True(t, m.stalled(time.Now(), time.Millisecond), "the scheduler's view saw a stall")
	assert.Zero(t, reads, "which does not read the threads' times")
}

// starveProcess runs the process on one P with two goroutines that never
// block while another sleeps 1 ms twenty times: each wake-up waits for the
// scheduler to preempt a busy goroutine (every 10 ms).
func starveProcess() {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 1e5; i++ {
				}
			}
		}()
	}
	for range 20 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
}

// Issue 47: the operating system starving the whole process is a stall of
// the client's too, and the Go scheduler cannot see it: a goroutine that
// never blocks is running as far as the runtime knows while its thread
// waits for a CPU. With 4 processes spinning per core beside it, this
// process's busy thread gets a fifth of a CPU or less: the meter sees its
// threads wait.
func TestStallMeterSeesTheOperatingSystemStarveTheProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the run-queue wait is read from Linux's /proc")
	}
	var m stallMeter
	start := time.Now()
	assert.False(t, m.starved(start), "the base")
	stop := spinners(t, 4*runtime.NumCPU())
	for time.Since(start) < 300*time.Millisecond {
		for i := 0; i < 1e5; i++ {
		}
	}
	stop()
	now := time.Now()
	assert.True(t, m.starved(now), "its thread waited for a CPU most of the time")
	assert.True(t, m.starved(now.Add(stallMemory/2)), "remembered")
	assert.False(t, m.starved(now.Add(stallMemory+time.Millisecond)), "forgotten after stallMemory")
}

// spinners starts n child processes that spin until stop kills them (or
// the test ends).
func spinners(t *testing.T, n int) (stop func()) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		cmds = nil
	}
	t.Cleanup(stop)
	for range n {
		c := exec.Command(os.Args[0], "-test.run", "^TestSpinner$")
		c.Env = append(os.Environ(), "OVERLOAD_SPINNER=1", "GOMAXPROCS=1")
		require.NoError(t, c.Start())
		cmds = append(cmds, c)
	}
	return stop
}

// TestSpinner is a child process of spinners: it spins until it is killed.
func TestSpinner(t *testing.T) {
	if os.Getenv("OVERLOAD_SPINNER") == "" {
		t.Skip("a child process of TestStallMeterSeesTheOperatingSystemStarveTheProcess")
	}
	for {
		for i := 0; i < 1e5; i++ {
		}
	}
}
