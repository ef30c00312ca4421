// Package breaker is the circuit of one upstream: failsafe-go's circuit
// breaker, with what the resilience handler adds around it. It says why
// the circuit opened (reason.go), picks and tracks the half-open probe
// (probe.go), and can be reconfigured while calls run, keeping its state
// (this file).
//
// A Circuit's state changes reach its owner through the function given to
// New, once per change, and only for the breaker in use: a breaker that a
// Reconfigure retired is silent.
package breaker

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// State is a circuit's state. Its values are those of the root package's
// CircuitState.
type State int32

// Circuit states, from the healthiest.
const (
	Closed   State = iota // calls flow; failures are counted
	HalfOpen              // one probe is let through
	Open                  // calls are refused
)

// Options are what a circuit breaker is built from. The zero Options is
// not valid: the root package fills in its defaults and validates them.
type Options struct {
	Disabled          bool
	FailureRatio      float64
	MinimumThroughput int
	SamplingDuration  time.Duration
	BreakDuration     time.Duration
}

// A Circuit is one upstream's circuit breaker. Its zero value is not
// usable; New makes one.
type Circuit struct {
	notify func(to State, reason error) // the owner's listener; reason says why, for Open

	cur        atomic.Pointer[current]   // the breaker in use, replaced by Reconfigure under probe.mu and swap
	seen       atomic.Int32              // the State the current breaker's listeners last saw
	breakUntil atomic.Pointer[time.Time] // an open state carried by Reconfigure half-opens then, if sooner
	swap       sync.Mutex                // orders a breaker's replacement with its listeners
	closing    atomic.Int32              // Close calls closing the breaker now
	closes     atomic.Uint64             // Close calls that have closed it
	failures   failureLog
	probe      probeGate
}

// current is a breaker and the options it was built from.
type current struct {
	b    circuitbreaker.CircuitBreaker[any] // nil when disabled
	opts Options
}

// New returns a closed circuit built from o. notify is called, without
// any of the circuit's locks held, with every change of its state.
func New(o Options, notify func(to State, reason error)) *Circuit {
	c := &Circuit{notify: notify}
	c.cur.Store(&current{b: c.build(o), opts: o})
	return c
}

// build returns a closed failsafe-go breaker for o, or nil when disabled.
// Its listeners act only while it is c's current breaker.
func (c *Circuit) build(o Options) circuitbreaker.CircuitBreaker[any] {
	if o.Disabled {
		return nil
	}
	var b circuitbreaker.CircuitBreaker[any]
	b = circuitbreaker.NewBuilder[any]().
		WithFailureRateThreshold(o.FailureRatio, uint(o.MinimumThroughput), o.SamplingDuration).
		WithDelay(o.BreakDuration).
		WithSuccessThreshold(1). // half-open admits one probe, as Polly does
		OnOpen(func(e circuitbreaker.StateChangedEvent) { c.onOpen(b, e) }).
		OnHalfOpen(func(circuitbreaker.StateChangedEvent) { c.onHalfOpen(b) }).
		OnClose(func(circuitbreaker.StateChangedEvent) { c.onClose(b) }).
		Build()
	return b
}

// Options returns the options of the breaker in use.
func (c *Circuit) Options() Options { return c.cur.Load().opts }

// Enabled reports whether the circuit has a breaker: whether outcomes
// are worth recording.
func (c *Circuit) Enabled() bool { return c.cur.Load().b != nil }

// Closed reports whether the circuit's listeners last saw it closed: the
// cheap test of the success path, which an attempt racing the circuit's
// opening may pass, as it would have a moment earlier.
func (c *Circuit) Closed() bool { return State(c.seen.Load()) == Closed }

// Admit asks the circuit to let an attempt through. It returns the probe's
// number when the attempt is the half-open probe (0 otherwise), or, when
// the circuit refuses, why: the reason it opened, or that its probe is in
// flight. A closed circuit admits every attempt, so neither the breaker's
// lock nor the gate's is taken while the listeners say it is closed: an
// attempt racing the circuit's opening goes through, as it would have a
// moment earlier.
func (c *Circuit) Admit() (probe uint64, refused error) {
	if c.Closed() {
		return 0, nil
	}
	return c.admitProbe()
}

// RecordSuccess counts an attempt that did not fail.
func (c *Circuit) RecordSuccess() {
	if b := c.cur.Load().b; b != nil {
		b.RecordSuccess()
	}
}

// RecordFailure counts a failed attempt, described by what (bounded and
// safe to log: the caller's to make so), which an opening keeps as part of
// its reason.
func (c *Circuit) RecordFailure(what string) {
	if b := c.cur.Load().b; b != nil {
		c.failures.record(what)
		b.RecordFailure()
	}
}

// State returns the circuit's state. An open circuit whose break is over
// is HalfOpen: the next attempt is its probe.
func (c *Circuit) State() State {
	b := c.cur.Load().b
	if b == nil {
		return Closed
	}
	switch b.State() {
	case circuitbreaker.OpenState:
		if c.remaining(b) <= 0 {
			return HalfOpen
		}
		return Open
	case circuitbreaker.HalfOpenState:
		return HalfOpen
	}
	return Closed
}

// RemainingBreak is how long the circuit stays open: 0 unless it is open.
func (c *Circuit) RemainingBreak() time.Duration {
	if b := c.cur.Load().b; b != nil {
		return c.remaining(b)
	}
	return 0
}

// remaining is how long b, open, stays open: its own delay, or less when
// a Reconfigure carried an open state with less of its break left.
func (c *Circuit) remaining(b circuitbreaker.CircuitBreaker[any]) time.Duration {
	d := b.RemainingDelay()
	if t := c.breakUntil.Load(); t != nil {
		d = max(0, min(d, time.Until(*t)))
	}
	return d
}

// Close closes the circuit if it is not closed, and reports whether it
// did. It takes no lock, so that a listener may call it; a Reconfigure
// replacing the breaker meanwhile sees closing or closes change, and
// closes the new breaker too.
func (c *Circuit) Close() bool {
	c.closing.Add(1)
	defer func() {
		c.closes.Add(1) // before closing drops: a replacement that sees neither saw this call end before it began
		c.closing.Add(-1)
	}()
	if b := c.cur.Load().b; b != nil && !b.IsClosed() {
		b.Close() // the OnClose listener reports it
		return true
	}
	return false
}

func (c *Circuit) onOpen(b circuitbreaker.CircuitBreaker[any], e circuitbreaker.StateChangedEvent) {
	if !c.entered(b, Open) || c.probe.quiet.Load() {
		return // a retired breaker, or a new probe being let through: not a new opening
	}
	c.opened(b, e.OldState == circuitbreaker.ClosedState)
}

// opened reports that b opened, and why: on the failures counted (from
// closed), or on the half-open probe's.
func (c *Circuit) opened(b circuitbreaker.CircuitBreaker[any], fromClosed bool) {
	summary := "the half-open probe failed"
	if fromClosed {
		// Not the event's Metrics(): they read the old state's statistics
		// without the breaker's lock while attempts in flight record into
		// them. The open state holds the same statistics, and the breaker
		// locks.
		m := b.Metrics()
		summary = fmt.Sprintf("%d of %d attempts failed", m.Failures(), m.Executions())
	}
	c.notify(Open, c.failures.opened(summary))
}

func (c *Circuit) onHalfOpen(b circuitbreaker.CircuitBreaker[any]) {
	if !c.entered(b, HalfOpen) || c.probe.quiet.Load() {
		return
	}
	c.notify(HalfOpen, nil)
}

func (c *Circuit) onClose(b circuitbreaker.CircuitBreaker[any]) {
	if !c.entered(b, Closed) {
		return
	}
	c.failures.reset() // a closed circuit counts afresh, and so explains afresh
	c.notify(Closed, nil)
}

// entered notes the state breaker b entered, if b is c's current breaker,
// and reports whether it is: the listeners of a retired breaker are silent.
func (c *Circuit) entered(b circuitbreaker.CircuitBreaker[any], s State) bool {
	c.swap.Lock()
	defer c.swap.Unlock()
	if c.cur.Load().b != b {
		return false
	}
	c.breakUntil.Store(nil) // any transition ends the break a Reconfigure carried
	c.seen.Store(int32(s))
	return true
}

// Reconfigure builds a new breaker from o, if o differs from the options
// of the one in use, and puts it in the state of the old one.
//
// The probe gate's lock keeps out the admissions of a circuit that is not
// closed and the probe's bookkeeping until the new breaker is in its state.
// The swap lock orders the replacement with the listeners of the old
// breaker: a transition they report before it is the circuit's, one after
// it is not (the old breaker is retired), and the state the old one is in
// then is what the new one carries. Once retired, the old breaker admits no
// attempt; an outcome that was on its way to it is not counted. A Close
// that ran while the state was carried may have closed the old breaker too
// late: the new one is closed then.
func (c *Circuit) Reconfigure(o Options) {
	old := c.cur.Load()
	if old.opts == o {
		return
	}
	nc := &current{b: c.build(o), opts: o}
	g := &c.probe
	g.mu.Lock()

	c.swap.Lock()
	c.cur.Store(nc)
	closes := c.closes.Load()
	prev := State(c.seen.Load())
	state, remaining, probing := Closed, time.Duration(0), false
	if ob := old.b; ob != nil && nc.b != nil {
		switch ob.State() {
		case circuitbreaker.OpenState:
			state, remaining = Open, c.remaining(ob)
		case circuitbreaker.HalfOpenState:
			state = HalfOpen
			probing = !ob.TryAcquirePermit() // its one permit is taken: a probe is in flight
		}
	}
	if state == Closed {
		// The new breaker, or none, is closed: say so before any listener
		// of the new breaker can say otherwise.
		c.breakUntil.Store(nil)
		c.seen.Store(int32(Closed))
	}
	c.swap.Unlock()

	nb := nc.b
	g.quiet.Store(true) // the circuit is not changing state: its listeners stay silent
	switch state {
	case Open:
		nb.Open()
		if remaining < o.BreakDuration {
			until := time.Now().Add(remaining)
			c.breakUntil.Store(&until)
		}
	case HalfOpen:
		nb.HalfOpen()
		if probing {
			nb.TryAcquirePermit() // the probe in flight holds it, and its outcome decides
		}
	}
	g.quiet.Store(false)
	if state != Closed && (c.closing.Load() != 0 || c.closes.Load() != closes) {
		nb.Close() // its listener reports it
		state, prev = Closed, Closed
	}
	g.mu.Unlock()

	// A transition of the old breaker that its listeners had not reported
	// when it was retired, or the circuit closed by disabling the breaker,
	// is reported here.
	if state == prev {
		return
	}
	switch state {
	case Open:
		c.opened(old.b, prev == Closed)
	case HalfOpen:
		c.notify(HalfOpen, nil)
	case Closed:
		c.failures.reset()
		c.notify(Closed, nil)
	}
}

// Breaker returns the failsafe-go breaker in use, nil when disabled, for
// what the Circuit does not wrap: its metrics, and tests that force a
// state on it.
func (c *Circuit) Breaker() circuitbreaker.CircuitBreaker[any] { return c.cur.Load().b }
