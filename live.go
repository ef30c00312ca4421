package resilience

import (
	"slices"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// Live configuration: a running Handler takes new Options without losing
// what it holds. Every call loads the handler's options once, when it
// starts (roundTrip), and reads only that snapshot to its end; the state
// the calls share (hostState's policies, the retry budget) is changed in
// place where it can be, and replaced, carrying its state, where
// failsafe-go's primitives are fixed when built.

// Options returns the options the handler runs with, defaults filled in: to
// change one field, change it in them and pass them to Update.
func (h *Handler) Options() Options {
	o := h.cfg.Load().Options
	o.Retry.Methods = slices.Clone(o.Retry.Methods)
	o.Retry.ExcludeMethods = slices.Clone(o.Retry.ExcludeMethods)
	o.Hedging.Endpoints = slices.Clone(o.Hedging.Endpoints)
	return o
}

// Update replaces the handler's options with opts, validated as NewHandler
// does; an invalid value, another Name (an empty one keeps it) or another
// PerHost.Enabled is an error that changes nothing. Calls in flight keep
// their options; the handler keeps its circuit, hosts, budget, permits and
// kept responses (docs/configuration.md). Do not call it from OnEvent or
// Logger.
func (h *Handler) Update(opts Options) error {
	cfg, err := h.prepare(opts)
	if err != nil {
		return err
	}
	h.commit(cfg)
	return nil
}

// prepare resolves opts for h and checks that h can take them, changing
// nothing.
func (h *Handler) prepare(opts Options) (*config, error) {
	cur := h.cfg.Load() // its Name and PerHost.Enabled never change
	if opts.Name == "" {
		opts.Name = cur.Name
	}
	if opts.Name != cur.Name {
		return nil, &optionError{handler: cur.Name, field: "Name", value: opts.Name,
			reason: "cannot change on a running handler"}
	}
	cfg, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if cfg.PerHost.Enabled != cur.PerHost.Enabled {
		return nil, &optionError{handler: cur.Name, field: "PerHost.Enabled", value: cfg.PerHost.Enabled,
			reason: "cannot change on a running handler, whose circuit and limits are one for all hosts or one per host; build a new Handler"}
	}
	return cfg, nil
}

// commit makes cfg, prepared, the handler's options.
func (h *Handler) commit(cfg *config) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The options first: a host met from here on is built from them, and a
	// host built from the old ones is in the table before hosts.all runs.
	h.cfg.Store(cfg)
	rb := cfg.RetryBudget
	h.budget.Set(rb.MaxTokens, rb.TokenRatio, rb.RetrySuccessTokens)
	h.fbStore.resize(cfg.Fallback.MaxBytes)
	if h.shared != nil {
		h.shared.reconfigure(cfg)
		return
	}
	t := h.hosts
	t.mu.Lock()
	t.max, t.idleAfter = cfg.PerHost.MaxHosts, cfg.PerHost.IdleTimeout
	t.mu.Unlock()
	for _, s := range t.all() {
		s.reconfigure(cfg)
	}
}

// reconfigure gives s the policies cfg describes, keeping those cfg does not
// change. h.mu must be held.
func (s *hostState) reconfigure(cfg *config) {
	old := s.policies.Load()
	p := &policies{breaker: old.breaker, bulkhead: old.bulkhead, limiter: old.limiter, overload: old.overload,
		rl: cfg.RateLimit, ov: cfg.Overload, cb: breakerOptionsOf(cfg)}
	if sameRateOptions(p.rl, old.rl) && p.cb == old.cb && p.ov == old.ov {
		return // a host met after the update, or nothing of its own changed
	}
	if p.ov != old.ov {
		// A new limiter learns afresh; the attempts holding the old one's
		// slots give them back to it.
		p.overload = nil
		if !p.ov.Disabled {
			p.overload = newOverloadLimiter(p.ov, time.Now)
		}
	}
	if p.rl.Disabled != old.rl.Disabled || p.rl.MaxConcurrent != old.rl.MaxConcurrent {
		p.bulkhead = nil
		if !p.rl.Disabled {
			p.bulkhead = bulkhead.New[any](uint(p.rl.MaxConcurrent))
		}
	}
	if p.rl.Disabled != old.rl.Disabled || p.rl.RequestsPerSecond != old.rl.RequestsPerSecond || p.rl.Burst != old.rl.Burst {
		p.limiter = nil
		if !p.rl.Disabled {
			p.limiter = newLimiter(p.rl)
		}
	}
	if p.cb == old.cb {
		s.policies.Store(p)
		return
	}
	p.breaker = s.newBreaker(p.cb)
	s.replaceBreaker(old.breaker, p)
}

// replaceBreaker makes p, whose breaker is new, s's policies, and puts the
// new breaker in the state of the old one, ob.
//
// The probe gate's lock keeps out the admissions of a circuit that is not
// closed and the probe's bookkeeping until the new breaker is in its state.
// The swap lock orders the replacement with the listeners of the old
// breaker: a transition they report before it is the circuit's, one after
// it is not (ob is retired), and the state ob is in then is what the new
// breaker carries. Once retired, ob admits no attempt; an outcome that was
// on its way to it when it was replaced is not counted. A CloseCircuit that
// ran while the state was carried may have closed ob too late: the new
// breaker is closed then.
func (s *hostState) replaceBreaker(ob circuitbreaker.CircuitBreaker[any], p *policies) {
	g := &s.probe
	g.mu.Lock()

	s.swap.Lock()
	s.policies.Store(p)
	closes := s.closes.Load()
	prev := CircuitState(s.circuit.Load())
	state, remaining, probing := CircuitClosed, time.Duration(0), false
	if ob != nil && p.breaker != nil {
		switch ob.State() {
		case circuitbreaker.OpenState:
			state, remaining = CircuitOpen, s.remainingBreak(ob)
		case circuitbreaker.HalfOpenState:
			state = CircuitHalfOpen
			probing = !ob.TryAcquirePermit() // its one permit is taken: a probe is in flight
		}
	}
	if state == CircuitClosed {
		// The new breaker, or none, is closed: say so before any listener
		// of the new breaker can say otherwise.
		s.breakUntil.Store(nil)
		s.circuit.Store(int32(CircuitClosed))
	}
	s.swap.Unlock()

	nb := p.breaker
	g.quiet.Store(true) // the circuit is not changing state: its listeners stay silent
	switch state {
	case CircuitOpen:
		nb.Open()
		if remaining < p.cb.breakDuration {
			until := time.Now().Add(remaining)
			s.breakUntil.Store(&until)
		}
	case CircuitHalfOpen:
		nb.HalfOpen()
		if probing {
			nb.TryAcquirePermit() // the probe in flight holds it, and its outcome decides
		}
	}
	g.quiet.Store(false)
	if state != CircuitClosed && (s.closing.Load() != 0 || s.closes.Load() != closes) {
		nb.Close() // its listener reports it
		state, prev = CircuitClosed, CircuitClosed
	}
	g.mu.Unlock()

	// A transition of the old breaker that its listeners had not reported
	// when it was retired, or the circuit closed by disabling the breaker,
	// is reported here.
	if state == prev {
		return
	}
	switch state {
	case CircuitOpen:
		s.reportOpened(ob, prev == CircuitClosed)
	case CircuitHalfOpen:
		s.h.emit(Event{Kind: EventCircuitHalfOpened, Host: s.host})
	case CircuitClosed:
		s.failures.reset()
		s.h.emit(Event{Kind: EventCircuitClosed, Host: s.host})
	}
}
