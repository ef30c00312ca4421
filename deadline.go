package resilience

import (
	"context"
	"sync"
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
// the slot points at the call it serves. Handlers keep the free ones
// (timerSlots), which saves a timer and a closure per call.
//
// A slot's timer is left running when its call ends or disarms it, and is
// reset only to fire earlier than it will: a call whose deadline is later
// than a pending firing is woken at that firing, finds its own deadline not
// yet passed and arms the timer again for it (fire). On the success path a
// call then neither resets nor stops the runtime's timer, which took a
// fifth of the handler's own time (bench/results/overhead-issue20.md): with
// the default 10 s attempt timeout, a slot's timer fires once per 10 s
// however many calls it serves.
type timerSlot struct {
	t *time.Timer

	mu  sync.Mutex
	c   *call     // the call it serves; nil while it is free
	due time.Time // when t fires; zero when it is stopped or has fired
}

func newTimerSlot() *timerSlot {
	s := &timerSlot{}
	s.t = time.AfterFunc(time.Hour, s.fire)
	s.t.Stop()
	return s
}

// timerSlots is a handler's free timer slots, at most maxFreeTimers; the
// zero value is empty. It is a list of its own rather than a sync.Pool,
// which drops what it holds at a garbage collection: a dropped slot's
// running timer would keep it alive until it fires, up to a deadline away.
// With the race detector, which drops a quarter of a Pool's Puts, 20,000
// calls kept 1 MiB so (TestFallbackMemoryBoundChunked).
type timerSlots struct {
	mu   sync.Mutex
	free []*timerSlot
}

// maxFreeTimers bounds the free slots a handler keeps: a slot given back
// beyond it is stopped and left to the collector.
const maxFreeTimers = 1024

func (p *timerSlots) lend() *timerSlot {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return s
	}
	p.mu.Unlock()
	return newTimerSlot()
}

func (p *timerSlots) recycle(s *timerSlot) {
	p.mu.Lock()
	if len(p.free) < maxFreeTimers {
		p.free = append(p.free, s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	s.t.Stop()
}

func (s *timerSlot) fire() {
	s.mu.Lock()
	s.due = time.Time{}
	c := s.c
	s.mu.Unlock()
	if c != nil {
		c.fire()
	}
}

// serve makes c the call the slot's firings reach; nil for none.
func (s *timerSlot) serve(c *call) {
	s.mu.Lock()
	s.c = c
	s.mu.Unlock()
}

// arm makes the timer fire for c no later than at.
func (s *timerSlot) arm(c *call, at, now time.Time) {
	s.mu.Lock()
	s.c = c
	if s.due.IsZero() || at.Before(s.due) {
		s.due = at
		s.t.Reset(at.Sub(now))
	}
	s.mu.Unlock()
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
// zero t disarms it (a firing still pending then finds nothing to do).
// c.mu must be held.
func (c *call) armLocked(t time.Time, cause error, now time.Time) {
	if t.IsZero() {
		c.armedCause = nil
		return
	}
	c.armedAt, c.armedCause = t, cause
	if c.timer == nil {
		c.timer = c.h.timers.lend()
	}
	c.timer.arm(c, t, now)
}

// releaseTimerLocked gives the timer back to the handler's free slots, still
// running if it is (timerSlot). c.mu must be held.
func (c *call) releaseTimerLocked() {
	if c.timer != nil {
		c.timer.serve(nil)
		c.h.timers.recycle(c.timer)
		c.timer = nil
	}
	c.armedCause = nil
}

func (c *call) fire() {
	c.mu.Lock()
	cause, cancel := c.armedCause, c.cancel
	now := time.Now()
	if cause == nil || cancel == nil {
		c.mu.Unlock() // disarmed
		return
	}
	if now.Before(c.armedAt) {
		// A firing for an earlier deadline: the call's own is still ahead.
		c.timer.arm(c, c.armedAt, now)
		c.mu.Unlock()
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

// attemptBudget is how long an attempt sent at now may take, as the
// deadline contract sends it: until the earliest of its attempt deadline,
// the total deadline and the request context's, or false when none
// applies.
func (c *call) attemptBudget(now time.Time) (time.Duration, bool) {
	at := c.deadline()
	if d := c.attemptLimit; d > 0 {
		if a := now.Add(d); at.IsZero() || a.Before(at) {
			at = a
		}
	}
	if at.IsZero() {
		return 0, false
	}
	return max(0, at.Sub(now)), true
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
