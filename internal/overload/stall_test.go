package overload

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The meter sees the process's own stall: with one P and two goroutines
// that never block, a goroutine that wakes from a sleep waits for the
// scheduler to preempt one of them (every 10 ms), far over a line of 1 ms;
// and it remembers the stall for stallMemory.
func TestStallMeterSeesTheProcessStarved(t *testing.T) {
	var m stallMeter
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
	var first stallMeter
	now := time.Now()
	assert.False(t, first.stalled(now, time.Millisecond), "a first look: the stall before it is the process's past")
	assert.False(t, first.stalled(now.Add(time.Millisecond), time.Hour), "nor did that look remember one (nothing waited an hour)")

	var m stallMeter
	m.stalled(now, time.Millisecond) // the base
	starveProcess()
	later := now.Add(stallMemory + time.Millisecond)
	assert.False(t, m.stalled(later, time.Millisecond), "the last look was over stallMemory ago: when the goroutines waited is unknown")
	assert.False(t, m.stalled(later.Add(time.Millisecond), time.Hour), "nor did that look remember one")
	starveProcess()
	assert.True(t, m.stalled(later.Add(2*time.Millisecond), time.Millisecond), "a stall since a recent look is seen")
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
