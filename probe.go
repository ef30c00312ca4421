package resilience

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

// probeGate is a host's record of its half-open probe.
type probeGate struct {
	mu    sync.Mutex
	n     uint64      // the number of the current probe; 0 before the first
	since time.Time   // when the current probe was let through
	quiet atomic.Bool // the breaker is re-entering half-open for a new probe: its listeners stay silent
}

// admit asks the circuit breaker to let an attempt through. It returns the
// probe's number when the attempt is the half-open probe (0 otherwise), or,
// when the circuit refuses, why. A closed circuit admits every attempt, so
// neither the breaker's lock nor the gate's is taken while the listeners say
// it is closed: an attempt racing the circuit's opening goes through, as it
// would have a moment earlier.
func (s *hostState) admit() (probe uint64, refused error) {
	if s.circuit.Load() == int32(CircuitClosed) {
		return 0, nil
	}
	g := &s.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	p := s.policies.Load() // under g.mu: an Update replaces the breaker under it too
	b := p.breaker
	if b == nil {
		return 0, nil
	}
	if t := s.breakUntil.Load(); t != nil && !time.Now().Before(*t) && b.State() == circuitbreaker.OpenState {
		b.HalfOpen() // the break an Update carried is over
	}
	if b.TryAcquirePermit() {
		if b.State() != circuitbreaker.HalfOpenState {
			return 0, nil // closed since the listeners last said
		}
		return g.startLocked(), nil
	}
	if b.State() != circuitbreaker.HalfOpenState {
		if reason := s.failures.lastReason(); reason != nil {
			return 0, reason
		}
		return 0, errOpen
	}
	running, every := time.Since(g.since), p.cb.breakDuration
	if running < every {
		return 0, &probingError{running: running, next: every - running, reason: s.failures.lastReason()}
	}
	// The probe in flight has had a whole BreakDuration: let another through.
	s.rearmLocked(b)
	if b.TryAcquirePermit() && b.State() == circuitbreaker.HalfOpenState {
		return g.startLocked(), nil
	}
	return 0, &probingError{reason: s.failures.lastReason()}
}

// startLocked numbers a new probe. g.mu must be held.
func (g *probeGate) startLocked() uint64 {
	g.n++
	g.since = time.Now()
	return g.n
}

// rearmLocked takes the breaker b, s's current one, out of half-open and
// back in, which gives it a fresh permit, without the events of a new
// opening. The probe that held the old permit may still report; its
// outcome then decides, as any attempt's does while half-open. g.mu must be
// held.
func (s *hostState) rearmLocked(b circuitbreaker.CircuitBreaker[any]) {
	s.probe.quiet.Store(true)
	defer s.probe.quiet.Store(false)
	b.Open()
	b.HalfOpen()
}

// releaseProbe gives back the permit of probe n, whose outcome says nothing
// about the upstream, so that the next call is the probe at once.
func (s *hostState) releaseProbe(n uint64) {
	if n == 0 {
		return
	}
	g := &s.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := s.breaker(); b != nil && n == g.n && b.State() == circuitbreaker.HalfOpenState {
		s.rearmLocked(b)
	}
}

// abandonProbe counts probe n, which the caller gave up on or the total
// timeout cut short, as a failure: the upstream did not answer in the time
// there was, and the circuit must not wait on a permit that will never come
// back. A probe whose permit has been superseded counts for nothing.
func (s *hostState) abandonProbe(n uint64, err error) {
	if n == 0 {
		return
	}
	g := &s.probe
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := s.breaker(); b != nil && n == g.n && b.State() == circuitbreaker.HalfOpenState {
		s.failures.record(nil, fmt.Errorf("half-open probe abandoned: %w", err))
		b.RecordFailure()
	}
}

// errOpen is why an open circuit refuses a call when no failure explains it.
var errOpen = errors.New("open")

// probingError is why a half-open circuit refuses a call: its probe is in
// flight.
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
