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

	now := time.Now()
	assert.True(t, m.stalled(now, time.Millisecond), "sleepers waited for busy goroutines to be preempted")
	assert.True(t, m.stalled(now.Add(stallMemory/2), time.Hour), "remembered")
	assert.False(t, m.stalled(now.Add(stallMemory), time.Hour), "forgotten after stallMemory, nothing waited an hour")
}
