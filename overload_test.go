package resilience

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testClock is an injected clock for the limiter's arithmetic.
type testClock struct{ t time.Time }

func (c *testClock) now() time.Time          { return c.t }
func (c *testClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newTestClock() *testClock               { return &testClock{t: time.Unix(1_000_000, 0)} }
func testOverloadOptions(min, initial int) OverloadOptions {
	return OverloadOptions{Enabled: true, MinLimit: min, MaxLimit: 100, InitialLimit: initial, MaxQueue: 2, MaxQueueWait: time.Second}
}

func TestOverloadLimiterTriesUpToTheLimit(t *testing.T) {
	l := newOverloadLimiter(testOverloadOptions(1, 3), time.Now)
	var slots []overloadSlot
	for range 3 {
		s, err := l.acquire(context.Background(), 0)
		require.NoError(t, err)
		slots = append(slots, s)
	}
	_, err := l.acquire(context.Background(), 0)
	require.ErrorIs(t, err, ErrOverloaded)
	var oe *OverloadError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 3, oe.Limit)
	assert.Equal(t, 3, oe.InFlight)
	assert.Contains(t, err.Error(), "limit 3")

	slots[0].release(overloadAnswered, time.Millisecond)
	s, err := l.acquire(context.Background(), 0)
	require.NoError(t, err, "a released slot is free again")
	s.release(overloadDropped, 0)
	for _, s := range slots[1:] {
		s.release(overloadDropped, 0)
	}
	st := l.stats()
	assert.Equal(t, 0, st.InFlight)
	assert.Equal(t, uint64(1), st.Refused)
	assert.Equal(t, time.Millisecond, st.Latency)
	overloadSlot{}.release(overloadAnswered, 0) // the zero slot holds nothing
}

func TestOverloadLimiterQueuesFirstAttemptsInOrder(t *testing.T) {
	l := newOverloadLimiter(testOverloadOptions(1, 1), time.Now)
	held, err := l.acquire(context.Background(), 0)
	require.NoError(t, err)

	got := make(chan int, 2)
	slots := make(chan overloadSlot, 2)
	for i := range 2 {
		go func() {
			s, err := l.acquire(context.Background(), time.Minute)
			if err == nil {
				got <- i
				slots <- s
			}
		}()
		require.Eventually(t, func() bool { return l.stats().Queued == i+1 }, time.Second, time.Millisecond)
	}
	_, err = l.acquire(context.Background(), time.Minute)
	require.ErrorIs(t, err, ErrOverloaded, "the queue holds MaxQueue")

	held.release(overloadAnswered, time.Millisecond)
	assert.Equal(t, 0, <-got, "first come, first served")
	(<-slots).release(overloadAnswered, time.Millisecond)
	assert.Equal(t, 1, <-got)
	(<-slots).release(overloadAnswered, time.Millisecond)
	assert.Equal(t, 0, l.stats().InFlight)
}

func TestOverloadLimiterWaitEnds(t *testing.T) {
	l := newOverloadLimiter(testOverloadOptions(1, 1), time.Now)
	held, err := l.acquire(context.Background(), 0)
	require.NoError(t, err)
	defer held.release(overloadDropped, 0)

	_, err = l.acquire(context.Background(), time.Millisecond)
	var oe *OverloadError
	require.ErrorAs(t, err, &oe)
	assert.Positive(t, oe.Waited)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.acquire(ctx, time.Minute)
	assert.ErrorIs(t, err, context.Canceled, "the caller left: its reason, not overload")
	assert.False(t, errors.Is(err, ErrOverloaded))
	assert.Equal(t, 0, l.stats().Queued)
}

// The loss cap: cut to lossFactor of the peak in flight, at most once per
// window, never under MinLimit; +1/cap per success, lifted over MaxLimit.
func TestOverloadLossCapArithmetic(t *testing.T) {
	clock := newTestClock()
	l := newOverloadLimiter(testOverloadOptions(2, 20), clock.now)
	var slots []overloadSlot
	for range 10 {
		s, err := l.acquire(context.Background(), 0)
		require.NoError(t, err)
		slots = append(slots, s)
	}
	assert.True(t, math.IsInf(l.lossCap, 1), "no loss, no cap")

	slots[0].release(overloadLoss, 0)
	assert.InDelta(t, 9, l.lossCap, 1e-9, "0.9 of the 10 seen in flight, not of the initial limit")
	assert.Equal(t, 9, l.stats().Limit)
	slots[1].release(overloadTimeout, 200*time.Millisecond)
	assert.InDelta(t, 9, l.lossCap, 1e-9, "once per window")

	clock.advance(lossWindow)
	slots[2].release(overloadLoss, 0)
	assert.InDelta(t, 9*0.9, l.lossCap, 1e-9, "0.9 of the cap: the peak since the last cut was over it")
	for _, s := range slots[3:] {
		s.release(overloadDropped, 0)
	}
	for range 30 {
		clock.advance(lossWindow)
		s, err := l.acquire(context.Background(), 0)
		require.NoError(t, err)
		s.release(overloadLoss, 0)
	}
	assert.InDelta(t, 2, l.lossCap, 1e-9, "never under MinLimit")

	s, err := l.acquire(context.Background(), 0)
	require.NoError(t, err)
	s.release(overloadAnswered, time.Millisecond)
	assert.InDelta(t, 2.5, l.lossCap, 1e-9, "+1/cap per success")
	for l.lossCap < 100 {
		s, _ := l.acquire(context.Background(), 0)
		s.release(overloadAnswered, time.Millisecond)
	}
	assert.True(t, math.IsInf(l.lossCap, 1), "lifted once over MaxLimit")

	before := l.lossCap
	clock.advance(lossWindow)
	s, _ = l.acquire(context.Background(), 0)
	s.release(overloadDropped, 0)
	assert.Equal(t, before, l.lossCap, "a dropped attempt says nothing")
}

func TestOverloadStateChangesOnce(t *testing.T) {
	clock := newTestClock()
	l := newOverloadLimiter(testOverloadOptions(1, 1), clock.now)
	now, changed := l.overloaded()
	assert.False(t, now)
	assert.False(t, changed)

	held, _ := l.acquire(context.Background(), 0)
	for range 3 {
		_, err := l.acquire(context.Background(), 0)
		require.ErrorIs(t, err, ErrOverloaded)
	}
	now, changed = l.overloaded()
	assert.True(t, now)
	assert.True(t, changed)
	now, changed = l.overloaded()
	assert.True(t, now)
	assert.False(t, changed, "one change, however many refusals")

	held.release(overloadAnswered, time.Millisecond)
	clock.advance(quietAfter)
	now, changed = l.overloaded()
	assert.False(t, now)
	assert.True(t, changed)
}
