package resilience

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"

	"github.com/resilienthttp/resilience/internal/breaker"
	"github.com/resilienthttp/resilience/internal/overload"
)

// A hostState is what one upstream keeps between calls: its circuit
// breaker, its concurrency and rate limits, and the failures that explain
// an open circuit. A Handler has one, or one per authority with PerHost.
type hostState struct {
	h    *Handler
	host string // the authority, with PerHost; "" otherwise

	policies atomic.Pointer[policies] // replaced by an Update that changes them (live.go)
	queued   atomic.Int64             // calls waiting for a gate permit, or about to
	circuit  *breaker.Circuit         // its breaker, the open reason and the half-open probe
	entry    hostEntry                // its place in the host table, with PerHost

	sharedLocal atomic.Bool // the shared rate's store last answered from its fallback (sharedFallback)

	// quota is what the upstream announced of its quota (serverquota.go).
	quota serverQuota

	// answers says that it has served an attempt: a response the retry
	// layer accepts, not a refusal. Until then, no attempt to it is held
	// past its limit as queued (deadlines.holds).
	answers atomic.Bool
}

// policies are a host's limits and the options they were
// built from. They never change: an Update that changes those options
// builds new ones (live.go).
type policies struct {
	bulkhead *gate                        // nil when disabled
	limiter  ratelimiter.RateLimiter[any] // nil without a rate
	overload *overload.Limiter            // nil when Overload is off
	rl       RateLimitOptions
	ov       OverloadOptions
}

func newHostState(h *Handler, host string) *hostState {
	s := &hostState{h: h, host: host}
	cfg := h.cfg.Load()
	s.circuit = breaker.New(breakerOptionsOf(cfg), s.onCircuit)
	s.policies.Store(newPolicies(cfg, nil))
	return s
}

// newPolicies builds a host's limits from cfg: the one place that builds
// them, at a host's start and on an Update. Each limit old holds that was
// built from the options cfg still gives is kept, with what it has learnt
// and the permits it has lent; old may be nil.
func newPolicies(cfg *config, old *policies) *policies {
	p := &policies{rl: cfg.RateLimit, ov: cfg.Overload}
	if old == nil {
		old = &policies{rl: RateLimitOptions{Disabled: true}, ov: OverloadOptions{Disabled: true}}
	}
	if p.ov == old.ov {
		p.overload = old.overload
	} else if !p.ov.Disabled {
		// A new limiter learns afresh; the attempts holding the old one's
		// slots give them back to it.
		p.overload = overload.New(overloadOptionsOf(p.ov), time.Now)
	}
	rl, was := p.rl, old.rl
	if rl.Disabled == was.Disabled && rl.MaxConcurrent == was.MaxConcurrent {
		p.bulkhead = old.bulkhead
	} else if !rl.Disabled {
		p.bulkhead = newGate(rl.MaxConcurrent)
	}
	if rl.Disabled == was.Disabled && rl.RequestsPerSecond == was.RequestsPerSecond && rl.Burst == was.Burst {
		p.limiter = old.limiter
	} else if !rl.Disabled {
		p.limiter = newLimiter(rl)
	}
	return p
}

func newLimiter(rl RateLimitOptions) ratelimiter.RateLimiter[any] {
	if rl.RequestsPerSecond <= 0 {
		return nil
	}
	return newRateLimiter(rl.RequestsPerSecond, rl.Burst)
}

// newRateLimiter spaces calls evenly at rps, or lets burst calls through
// per burst/rps period.
func newRateLimiter(rps float64, burst int) ratelimiter.RateLimiter[any] {
	interval := time.Duration(float64(time.Second) / rps)
	if burst <= 1 {
		return ratelimiter.NewSmoothWithMaxRate[any](interval)
	}
	return ratelimiter.NewBursty[any](uint(burst), interval*time.Duration(burst))
}

// onCircuit reports a change of s's circuit to the handler's observers.
func (s *hostState) onCircuit(to breaker.State, reason error) {
	kind := EventCircuitClosed
	switch to {
	case breaker.Open:
		kind = EventCircuitOpened
	case breaker.HalfOpen:
		kind = EventCircuitHalfOpened
	}
	s.h.emit(Event{Kind: kind, Host: s.host, Err: reason})
}

// circuitState is the state of s's circuit.
func (s *hostState) circuitState() CircuitState { return CircuitState(s.circuit.State()) }

// abandonProbe counts probe n of s's circuit (0: none), which the caller
// gave up on or a deadline cut short with err, as a failure
// (breaker.Circuit.AbandonProbe).
func (s *hostState) abandonProbe(n uint64, err error) {
	if n != 0 {
		s.circuit.AbandonProbe(n, describe(nil, fmt.Errorf("half-open probe abandoned: %w", err), nil))
	}
}

// overloadOptionsOf is what the overload limiter is built from: ov
// without what the handler reads itself (Disabled, MaxQueueWait).
func overloadOptionsOf(ov OverloadOptions) overload.Options {
	return overload.Options{MinLimit: ov.MinLimit, MaxLimit: ov.MaxLimit, InitialLimit: ov.InitialLimit, MaxQueue: ov.MaxQueue}
}

func breakerOptionsOf(cfg *config) breaker.Options {
	cb := cfg.CircuitBreaker
	return breaker.Options{Disabled: cb.Disabled, FailureRatio: cb.FailureRatio, MinimumThroughput: cb.MinimumThroughput,
		SamplingDuration: cb.SamplingDuration, BreakDuration: cb.BreakDuration}
}

// served notes that the upstream served an attempt.
func (s *hostState) served() {
	if !s.answers.Load() {
		s.answers.Store(true)
	}
}
