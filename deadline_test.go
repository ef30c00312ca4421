package resilience

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A timer slot is handed on still running (deadline.go): the next call's
// deadline holds whether it is later or earlier than the firing the slot
// still has pending.
func TestTimerSlotHandedOnRunning(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/fast" {
			return
		}
		select { // hold the headers until the attempt is cut, or give up
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	h, err := NewHandler(Options{Retry: RetryOptions{Disabled: true}, StrictAttemptTimeout: true})
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(&http.Transport{})}
	get := func(path string, attempt time.Duration) (time.Duration, error) {
		req, err := http.NewRequestWithContext(WithAttemptTimeout(context.Background(), attempt), http.MethodGet, up.URL()+path, nil)
		require.NoError(t, err)
		start := time.Now()
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return time.Since(start), err
	}

	// A later deadline than the pending firing: the early firing re-arms.
	_, err = get("/fast", 20*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, h.timers.free, 1, "the call gave its slot back, its timer still running")
	took, err := get("/slow", 150*time.Millisecond)
	require.ErrorIs(t, err, ErrAttemptTimeout, "re-armed by the firing left from the call before")
	assert.GreaterOrEqual(t, took, 150*time.Millisecond, "not cut by that firing")

	// An earlier deadline than the pending one (10 s): the timer is reset.
	_, err = get("/fast", 10*time.Second)
	require.NoError(t, err)
	_, err = get("/slow", 30*time.Millisecond)
	require.ErrorIs(t, err, ErrAttemptTimeout)
}

// Past maxFreeTimers, a slot given back is stopped and dropped.
func TestTimerSlotsBounded(t *testing.T) {
	var p timerSlots
	slots := make([]*timerSlot, maxFreeTimers+1)
	for i := range slots {
		slots[i] = p.lend()
		slots[i].arm(nil, time.Now().Add(time.Hour), time.Now())
	}
	for _, s := range slots {
		p.recycle(s)
	}
	assert.Len(t, p.free, maxFreeTimers)
	assert.False(t, slots[maxFreeTimers].t.Stop(), "the slot dropped was stopped")
	assert.True(t, slots[0].t.Stop(), "a slot kept runs on")
	assert.Same(t, slots[maxFreeTimers-1], p.lend(), "last in, first out")
}

// A held attempt is looked at again a quarter of its limit later, never
// sooner than a millisecond: a limit of a few nanoseconds must not spin
// its timer.
func TestHoldStepHasAFloor(t *testing.T) {
	assert.Equal(t, 50*time.Millisecond, holdStep(200*time.Millisecond))
	assert.Equal(t, time.Millisecond, holdStep(2*time.Nanosecond))
	assert.Equal(t, time.Millisecond, holdStep(time.Millisecond))
}
