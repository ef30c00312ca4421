package resilience

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
)

// A hostState is what one upstream keeps between calls: its circuit
// breaker, its concurrency and rate limits, and the failures that explain
// an open circuit. A Handler has one, or one per authority with PerHost.
type hostState struct {
	h    *Handler
	host string // the authority, with PerHost; "" otherwise

	policies   atomic.Pointer[policies]  // replaced by an Update that changes them (live.go)
	queued     atomic.Int64              // calls waiting for a bulkhead permit
	circuit    atomic.Int32              // CircuitState as the current breaker's listeners last saw it
	breakUntil atomic.Pointer[time.Time] // an open circuit carried across an Update half-opens then, if sooner (live.go)
	swap       sync.Mutex                // orders a breaker's replacement with its listeners (live.go)
	closing    atomic.Int32              // CloseCircuit calls closing this host's breaker now
	closes     atomic.Uint64             // CloseCircuit calls that have closed it
	failures   failureLog
	entry      hostEntry // its place in the host table, with PerHost
	probe      probeGate // the half-open probe

	sharedLocal atomic.Bool // the shared rate's store last answered from its fallback (shared.go)

	// quota is what the upstream announced of its quota (serverquota.go).
	quota serverQuota
}

// policies are a host's failsafe-go primitives and the options they were
// built from. They never change: an Update that changes those options
// builds new ones (live.go).
type policies struct {
	breaker  circuitbreaker.CircuitBreaker[any] // nil when disabled
	bulkhead bulkhead.Bulkhead[any]             // nil when disabled
	limiter  ratelimiter.RateLimiter[any]       // nil without a rate
	overload *overloadLimiter                   // nil when Overload is off (overload.go)
	rl       RateLimitOptions
	ov       OverloadOptions
	cb       breakerOptions
}

func newHostState(h *Handler, host string) *hostState {
	s := &hostState{h: h, host: host}
	cfg := h.cfg.Load()
	p := &policies{rl: cfg.RateLimit, ov: cfg.Overload, cb: breakerOptionsOf(cfg)}
	if rl := p.rl; !rl.Disabled {
		p.bulkhead = bulkhead.New[any](uint(rl.MaxConcurrent))
		p.limiter = newLimiter(rl)
	}
	if !p.ov.Disabled {
		p.overload = newOverloadLimiter(p.ov, time.Now)
	}
	p.breaker = s.newBreaker(p.cb)
	s.policies.Store(p)
	return s
}

// breakerOptions are the options a circuit breaker is built from.
// ShouldHandle is not among them: each attempt reads it from its call's
// options.
type breakerOptions struct {
	disabled          bool
	failureRatio      float64
	minimumThroughput int
	samplingDuration  time.Duration
	breakDuration     time.Duration
}

func breakerOptionsOf(cfg *config) breakerOptions {
	cb := cfg.CircuitBreaker
	return breakerOptions{cb.Disabled, cb.FailureRatio, cb.MinimumThroughput, cb.SamplingDuration, cb.BreakDuration}
}

// newBreaker builds a closed circuit breaker for s, or nil when disabled.
// Its listeners act only while it is s's current breaker.
func (s *hostState) newBreaker(cb breakerOptions) circuitbreaker.CircuitBreaker[any] {
	if cb.disabled {
		return nil
	}
	var b circuitbreaker.CircuitBreaker[any]
	b = circuitbreaker.NewBuilder[any]().
		WithFailureRateThreshold(cb.failureRatio, uint(cb.minimumThroughput), cb.samplingDuration).
		WithDelay(cb.breakDuration).
		WithSuccessThreshold(1). // half-open admits one probe, as Polly does
		OnOpen(func(e circuitbreaker.StateChangedEvent) { s.onOpen(b, e) }).
		OnHalfOpen(func(circuitbreaker.StateChangedEvent) { s.onHalfOpen(b) }).
		OnClose(func(circuitbreaker.StateChangedEvent) { s.onClose(b) }).
		Build()
	return b
}

// breaker returns s's current circuit breaker, or nil when disabled.
func (s *hostState) breaker() circuitbreaker.CircuitBreaker[any] {
	return s.policies.Load().breaker
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

func (s *hostState) circuitState() CircuitState {
	b := s.breaker()
	if b == nil {
		return CircuitClosed
	}
	switch b.State() {
	case circuitbreaker.OpenState:
		if s.remainingBreak(b) <= 0 {
			return CircuitHalfOpen
		}
		return CircuitOpen
	case circuitbreaker.HalfOpenState:
		return CircuitHalfOpen
	}
	return CircuitClosed
}

// remainingBreak is how long b, open, stays open: its own delay, or less
// when an Update carried an open circuit with less of its break left.
func (s *hostState) remainingBreak(b circuitbreaker.CircuitBreaker[any]) time.Duration {
	d := b.RemainingDelay()
	if t := s.breakUntil.Load(); t != nil {
		d = max(0, min(d, time.Until(*t)))
	}
	return d
}

// closeBreaker closes s's circuit if it is not closed, and reports whether
// it did. It takes no lock, so that an event observer may call it; an
// Update replacing the breaker meanwhile sees closing or closes change, and
// closes the new breaker too (live.go).
func (s *hostState) closeBreaker() bool {
	s.closing.Add(1)
	defer func() {
		s.closes.Add(1) // before closing drops: a replacement that sees neither saw this call end before it began
		s.closing.Add(-1)
	}()
	if b := s.breaker(); b != nil && !b.IsClosed() {
		b.Close() // the OnClose listener emits the event
		return true
	}
	return false
}

func (s *hostState) onOpen(b circuitbreaker.CircuitBreaker[any], e circuitbreaker.StateChangedEvent) {
	if !s.entered(b, CircuitOpen) || s.probe.quiet.Load() {
		return // a retired breaker, or a new probe being let through: not a new opening
	}
	s.reportOpened(b, e.OldState == circuitbreaker.ClosedState)
}

// reportOpened says why b opened: from closed, on the failures counted, or
// on the half-open probe's.
func (s *hostState) reportOpened(b circuitbreaker.CircuitBreaker[any], fromClosed bool) {
	summary := "the half-open probe failed"
	if fromClosed {
		// Not the event's Metrics(): they read the old state's statistics
		// without the breaker's lock while attempts in flight record into
		// them. The open state holds the same statistics, and the breaker
		// locks.
		m := b.Metrics()
		summary = fmt.Sprintf("%d of %d attempts failed", m.Failures(), m.Executions())
	}
	reason := s.failures.opened(summary)
	s.h.emit(Event{Kind: EventCircuitOpened, Host: s.host, Err: reason})
}

func (s *hostState) onHalfOpen(b circuitbreaker.CircuitBreaker[any]) {
	if !s.entered(b, CircuitHalfOpen) || s.probe.quiet.Load() {
		return
	}
	s.h.emit(Event{Kind: EventCircuitHalfOpened, Host: s.host})
}

func (s *hostState) onClose(b circuitbreaker.CircuitBreaker[any]) {
	if !s.entered(b, CircuitClosed) {
		return
	}
	s.failures.reset() // a closed circuit counts afresh, and so explains afresh
	s.h.emit(Event{Kind: EventCircuitClosed, Host: s.host})
}

// entered notes the state breaker b entered, if b is s's current breaker,
// and reports whether it is: the listeners of a breaker an Update retired
// are silent.
func (s *hostState) entered(b circuitbreaker.CircuitBreaker[any], state CircuitState) bool {
	s.swap.Lock()
	defer s.swap.Unlock()
	if s.breaker() != b {
		return false
	}
	s.breakUntil.Store(nil) // any transition ends the break an Update carried
	s.circuit.Store(int32(state))
	return true
}
