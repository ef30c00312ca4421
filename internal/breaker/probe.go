package breaker

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// The half-open circuit and its probe.
//
// failsafe-go's breaker, built with WithSuccessThreshold(1), lets one
// attempt through while the circuit is half-open and decides on the next
// outcome recorded. Three things are left to the code that takes its
// permits, and this file does them:
//
//   - Which permit is the probe. The breaker itself says so: a permit taken
//     while it reports half-open is the probe (a closed circuit's permits
//     are not, and an open one grants none). A listener's bookkeeping cannot
//     say it, since listeners run after the breaker has released its lock
//     and a caller can take the permit in between.
//   - A probe that can never report. One whose failure is the request's own
//     (its body's reader failed) gives its permit back; one the caller gave
//     up on counts as a failure. Either way the circuit moves on.
//   - A probe that hangs. Once it has run for a whole BreakDuration another
//     is let through, as Polly does, instead of refusing every call until
//     the hung probe's own timeout.
//
// Admission while the circuit is not closed is serialised by the gate's
// mutex, so the breaker's state, its permit and the gate agree. A closed
// circuit never takes it.

// probeGate is a circuit's record of its half-open probe.
type probeGate struct {
	mu    sync.Mutex
	n     uint64      // the number of the current probe; 0 before the first
	since time.Time   // when the current probe was let through
	quiet atomic.Bool // the breaker is re-entering half-open for a new probe: its listeners stay silent
}

// admitProbe is Admit for a circuit that is not closed: the probe's gate.
func (c *Circuit) admitProbe() (probe uint64, refused error) {
	g := &c.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := c.cur.Load() // under g.mu: Reconfigure replaces the breaker under it too
	b := cur.b
	if b == nil {
		return 0, nil
	}
	if t := c.breakUntil.Load(); t != nil && !time.Now().Before(*t) && b.State() == circuitbreaker.OpenState {
		b.HalfOpen() // the break a Reconfigure carried is over
	}
	if b.TryAcquirePermit() {
		if b.State() != circuitbreaker.HalfOpenState {
			return 0, nil // closed since the listeners last said
		}
		return g.startLocked(), nil
	}
	if b.State() != circuitbreaker.HalfOpenState {
		if reason := c.failures.lastReason(); reason != nil {
			return 0, reason
		}
		return 0, errOpen
	}
	running, every := time.Since(g.since), cur.opts.BreakDuration
	if running < every {
		return 0, &probingError{running: running, next: every - running, reason: c.failures.lastReason()}
	}
	// The probe in flight has had a whole BreakDuration: let another through.
	c.rearmLocked(b)
	if b.TryAcquirePermit() && b.State() == circuitbreaker.HalfOpenState {
		return g.startLocked(), nil
	}
	return 0, &probingError{reason: c.failures.lastReason()}
}

// startLocked numbers a new probe. g.mu must be held.
func (g *probeGate) startLocked() uint64 {
	g.n++
	g.since = time.Now()
	return g.n
}

// rearmLocked takes the breaker b, c's current one, out of half-open and
// back in, which gives it a fresh permit, without the events of a new
// opening. The probe that held the old permit may still report; its
// outcome then decides, as any attempt's does while half-open. c.probe.mu
// must be held.
func (c *Circuit) rearmLocked(b circuitbreaker.CircuitBreaker[any]) {
	c.probe.quiet.Store(true)
	defer c.probe.quiet.Store(false)
	b.Open()
	b.HalfOpen()
}

// ReleaseProbe gives back the permit of probe n (0: none), whose outcome
// says nothing about the upstream, so that the next attempt is the probe
// at once.
func (c *Circuit) ReleaseProbe(n uint64) {
	if n == 0 {
		return
	}
	g := &c.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := c.cur.Load().b; b != nil && n == g.n && b.State() == circuitbreaker.HalfOpenState {
		c.rearmLocked(b)
	}
}

// AbandonProbe counts probe n (0: none), which the caller gave up on or a
// deadline cut short, as a failure described by what: the upstream did
// not answer in the time there was, and the circuit must not wait on a
// permit that will never come back. A probe whose permit has been
// superseded counts for nothing.
func (c *Circuit) AbandonProbe(n uint64, what string) {
	if n == 0 {
		return
	}
	g := &c.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := c.cur.Load().b; b != nil && n == g.n && b.State() == circuitbreaker.HalfOpenState {
		c.failures.record(what)
		b.RecordFailure()
	}
}

// errOpen is why an open circuit refuses an attempt when no failure
// explains it.
var errOpen = errors.New("open")

// probingError is why a half-open circuit refuses an attempt: its probe is
// in flight.
type probingError struct {
	running, next time.Duration // how long the probe has run; when another may go
	reason        error         // why the circuit opened, if known
}

func (e *probingError) Error() string {
	msg := "half-open, its probe in flight"
	if e.running > 0 {
		msg = fmt.Sprintf("half-open, its probe in flight for %v (another in %v)",
			e.running.Round(time.Millisecond), e.next.Round(time.Millisecond))
	}
	if e.reason != nil {
		msg += "; " + e.reason.Error()
	}
	return msg
}

func (e *probingError) Unwrap() error { return e.reason }
