package resilience

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGateLendsAtMostMax(t *testing.T) {
	g := newGate(2)
	require.True(t, g.tryAcquire())
	require.True(t, g.tryAcquire())
	assert.False(t, g.tryAcquire(), "a third permit of two")
	g.release()
	assert.True(t, g.tryAcquire(), "the permit given back")
	assert.False(t, g.tryAcquire())
}

// A permit given back goes to the call that has waited longest, and a
// call that arrives while others wait does not take it first.
func TestGateHandsPermitsOnInOrder(t *testing.T) {
	g := newGate(1)
	require.True(t, g.tryAcquire())
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			require.NoError(t, g.wait(context.Background(), time.Time{}))
			order <- i
		}()
		require.Eventually(t, func() bool { return g.waiting.Load() == int64(i+1) }, 5*time.Second, time.Millisecond)
	}
	assert.False(t, g.tryAcquire(), "no barging past waiting calls")
	for want := range 3 {
		g.release()
		assert.Equal(t, want, <-order)
	}
	g.release()
	assert.Zero(t, g.lent.Load())
	assert.Zero(t, g.waiting.Load())
}

func TestGateWaitGivesUp(t *testing.T) {
	g := newGate(1)
	require.True(t, g.tryAcquire())

	err := g.wait(context.Background(), time.Now().Add(5*time.Millisecond))
	assert.ErrorIs(t, err, errGateTimeout)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, g.wait(ctx, time.Time{}), context.Canceled)

	assert.Zero(t, g.waiting.Load(), "those that gave up left the line")
	g.release()
	assert.True(t, g.tryAcquire(), "and took no permit with them")
}

// Under churn (calls that take, wait, give up and give back at once) no
// permit is lost or made: at the end all are free, and no more than max
// were ever out.
func TestGateChurnLosesNoPermit(t *testing.T) {
	const max = 3
	g := newGate(max)
	var out, most atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				ok := g.tryAcquire()
				if !ok {
					ctx, cancel := context.WithCancel(context.Background())
					if (i+j)%3 == 0 {
						cancel() // gives up at once, perhaps as a permit is handed to it
					}
					var deadline time.Time
					if (i+j)%3 == 1 {
						deadline = time.Now().Add(50 * time.Microsecond)
					}
					ok = g.wait(ctx, deadline) == nil
					cancel()
				}
				if ok {
					n := out.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					out.Add(-1)
					g.release()
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(max))
	assert.Zero(t, g.lent.Load(), "every permit came back")
	assert.Zero(t, g.waiting.Load())
	for range max {
		assert.True(t, g.tryAcquire())
	}
	assert.False(t, g.tryAcquire())
}
