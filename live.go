package resilience

import (
	"slices"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
)

// Live configuration: a running Handler takes new Options without losing
// what it holds. Every call loads the handler's options once, when it
// starts (roundTrip), and reads only that snapshot to its end; the state
// the calls share (hostState's policies, the retry budget) is changed in
// place where it can be, and replaced, carrying its state, where
// failsafe-go's primitives are fixed when built.

// Options returns the options the handler runs with, every default filled
// in: what a zero field of the Options it was made or last updated with
// means. Change a field and pass the result to Update to change only that
// field. The slices are copies; the interfaces and functions (Store,
// Shared, ShouldRetry, OnEvent, Logger, ...) are the handler's own.
func (h *Handler) Options() Options {
	o := h.cfg.Load().Options
	o.Retry.Methods = slices.Clone(o.Retry.Methods)
	o.Retry.ExcludeMethods = slices.Clone(o.Retry.ExcludeMethods)
	o.Hedging.Endpoints = slices.Clone(o.Hedging.Endpoints)
	return o
}

// Update replaces the handler's options with opts. opts is validated
// first, as NewHandler validates: an invalid value is an error that names
// the field, and changes nothing. An empty Name keeps the handler's name;
// another name is an error, as is a change of PerHost.Enabled (see below).
//
// The update is atomic: a call in flight finishes under the options it
// started with (its retries, delays, timeouts, predicates, observers), and
// every call that starts after Update returns runs under the new ones.
//
// What the handler holds is kept:
//
//   - Isolation (IsolateCircuit) and, with PerHost, every host's state.
//   - The retry budget's tokens and the claims of the retries in flight.
//     New MaxTokens, TokenRatio and RetrySuccessTokens apply at once; a
//     lower MaxTokens drops the tokens above it. Disabling the budget keeps
//     its tokens for when it is enabled again.
//   - The circuit. CircuitBreaker.ShouldHandle applies from the next call.
//     A change of FailureRatio, MinimumThroughput, SamplingDuration or
//     BreakDuration cannot be made to a failsafe-go breaker in place, so a
//     new breaker replaces it, in the state of the old: an open circuit
//     stays open for the rest of its break (at most the new BreakDuration),
//     a half-open one stays half-open with its probe in flight, and a closed
//     one stays closed but counts its failures afresh, over the new
//     SamplingDuration. Disabling the breaker closes the circuit.
//   - The concurrency permits in flight. Every call gives its permit back
//     to the limit it took it from. A new RateLimit.MaxConcurrent (or
//     RateLimit.Disabled) makes a new limit for the calls admitted from
//     then on: until the calls admitted before have ended, they are not
//     counted against it, so at most the old limit's calls in flight plus
//     the new limit run at once. RateLimit.MaxQueue applies at once; a new
//     RequestsPerSecond or Burst makes a new rate limiter, whose burst is
//     available at once.
//   - The fallback layer's kept responses. A new Fallback.MaxBytes bounds
//     the built-in store at once: a smaller one forgets the least recently
//     used responses until they fit.
//
// Every other field (retries, hedging, timeouts, MaxBufferedBody,
// PerHost.MaxHosts and IdleTimeout, Logger, LogLevels, OnEvent) applies
// from the next call, or the next host met.
//
// PerHost.Enabled cannot change: a handler has one circuit and one set of
// limits for all hosts, or one per host, and neither can be made from the
// other. Build a new Handler for that.
//
// Update is safe to call while the handler serves calls, but not from its
// OnEvent or Logger: some events about the circuit are sent while the lock
// Update needs is held.
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

// reconfigure gives s the policies and the circuit breaker cfg describes,
// keeping those cfg does not change. h.mu must be held.
func (s *hostState) reconfigure(cfg *config) {
	s.circuit.Reconfigure(breakerOptionsOf(cfg)) // keeps the circuit's state
	old := s.policies.Load()
	p := &policies{bulkhead: old.bulkhead, limiter: old.limiter, overload: old.overload, rl: cfg.RateLimit, ov: cfg.Overload}
	if sameRateOptions(p.rl, old.rl) && p.ov == old.ov {
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
	s.policies.Store(p)
}
