package resilience

import (
	"context"
	"sync/atomic"
	"time"
)

// One timer per call enforces both deadlines. While an attempt waits for its
// headers the timer is armed for the earlier of the attempt and total
// deadlines; when it fires it cancels the attempt's context with the
// deadline's sentinel as the cause. Once headers arrive only the total
// deadline applies, but the timer is not re-armed then: the success path
// stays cheap, and if the attempt deadline fires during the body it simply
// re-arms for the total deadline. A retried response drains under a short
// bound of its own.

// A timerSlot is a reusable timer whose function is bound once, to the slot;
// the slot points at the call it serves. Handlers pool them, which saves a
// timer and a closure per call. A firing that was already on its way when
// the slot changed hands reaches the next call, which ignores it because
// its own deadline has not passed.
type timerSlot struct {
	t *time.Timer
	c atomic.Pointer[call]
}

func newTimerSlot() any {
	s := &timerSlot{}
	s.t = time.AfterFunc(time.Hour, s.fire)
	s.t.Stop()
	return s
}

func (s *timerSlot) fire() {
	if c := s.c.Load(); c != nil {
		c.fire()
	}
}

// start makes cancel the current attempt's and arms the timer for the
// earlier of the attempt and total deadlines, from now.
func (c *call) start(cancel context.CancelCauseFunc, now time.Time) {
	at, cause := c.totalAt, ErrTotalTimeout
	if d := c.attemptLimit; d > 0 {
		if a := now.Add(d); at.IsZero() || a.Before(at) {
			at, cause = a, ErrAttemptTimeout
		}
	}
	c.mu.Lock()
	prev := c.cancel
	c.cancel, c.fired, c.inBody = cancel, nil, false
	c.armLocked(at, cause, now)
	c.mu.Unlock()
	if prev != nil {
		prev(nil) // the previous attempt failed without a body to drain
	}
}

// headers is called when an attempt's RoundTrip returns. It reports the
// deadline that cut the attempt short, if one did; otherwise the attempt
// deadline no longer applies.
func (c *call) headers() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fired == nil {
		c.inBody = true
	}
	return c.fired
}

// armLocked sets the timer to cancel the current attempt with cause at t; a
// zero t disarms it. c.mu must be held.
func (c *call) armLocked(t time.Time, cause error, now time.Time) {
	if t.IsZero() {
		c.armedCause = nil
		if c.timer != nil {
			c.timer.t.Stop()
		}
		return
	}
	c.armedAt, c.armedCause = t, cause
	if c.timer == nil {
		c.timer = c.h.timers.Get().(*timerSlot)
		c.timer.c.Store(c)
	}
	c.timer.t.Reset(t.Sub(now))
}

// releaseTimerLocked stops the timer and gives it back to the handler's
// pool. c.mu must be held.
func (c *call) releaseTimerLocked() {
	if c.timer != nil {
		c.timer.t.Stop()
		c.timer.c.Store(nil)
		c.h.timers.Put(c.timer)
		c.timer = nil
	}
	c.armedCause = nil
}

func (c *call) fire() {
	c.mu.Lock()
	cause, cancel := c.armedCause, c.cancel
	now := time.Now()
	if cause == nil || cancel == nil || now.Before(c.armedAt) {
		c.mu.Unlock() // disarmed, or re-armed since this firing was scheduled
		return
	}
	if cause == ErrAttemptTimeout && c.inBody {
		// The headers came in time; from here on only the total deadline counts.
		c.armLocked(c.totalAt, ErrTotalTimeout, now)
		c.mu.Unlock()
		return
	}
	c.fired, c.armedCause = cause, nil
	expire := cause == ErrTotalTimeout && c.delivered
	c.mu.Unlock()
	cancel(cause)
	if expire {
		deliveredBody{c}.expire()
	}
}

// deadline is when the call must be over: the earlier of the total
// timeout and the request context's own deadline (http.Client.Timeout is
// one), or zero when it has neither.
func (c *call) deadline() time.Time {
	deadline := c.totalAt
	if d, ok := c.req.Context().Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	return deadline
}
