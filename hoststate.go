package resilience

import (
	"fmt"
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

	breaker  circuitbreaker.CircuitBreaker[any] // nil when disabled
	bulkhead bulkhead.Bulkhead[any]             // nil when disabled
	limiter  ratelimiter.RateLimiter[any]       // nil without a rate
	queued   atomic.Int64                       // calls waiting for a bulkhead permit
	circuit  atomic.Int32                       // CircuitState as the breaker's listeners last saw it
	failures failureLog
	entry    hostEntry // its place in the host table, with PerHost
	probe    probeGate // the half-open circuit's probe
}

func newHostState(h *Handler, host string) *hostState {
	s := &hostState{h: h, host: host}
	cfg := h.cfg
	if rl := cfg.RateLimit; !rl.Disabled {
		s.bulkhead = bulkhead.New[any](uint(rl.MaxConcurrent))
		if rl.RequestsPerSecond > 0 {
			s.limiter = newRateLimiter(rl.RequestsPerSecond, rl.Burst)
		}
	}
	if cb := cfg.CircuitBreaker; !cb.Disabled {
		s.breaker = circuitbreaker.NewBuilder[any]().
			WithFailureRateThreshold(cb.FailureRatio, uint(cb.MinimumThroughput), cb.SamplingDuration).
			WithDelay(cb.BreakDuration).
			WithSuccessThreshold(1). // half-open admits one probe, as Polly does
			OnOpen(s.onOpen).
			OnHalfOpen(s.onHalfOpen).
			OnClose(s.onClose).
			Build()
	}
	return s
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
	if s.breaker == nil {
		return CircuitClosed
	}
	switch s.breaker.State() {
	case circuitbreaker.OpenState:
		if s.breaker.RemainingDelay() <= 0 {
			return CircuitHalfOpen
		}
		return CircuitOpen
	case circuitbreaker.HalfOpenState:
		return CircuitHalfOpen
	}
	return CircuitClosed
}

func (s *hostState) onOpen(e circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitOpen))
	if s.probe.quiet.Load() {
		return // a new probe is being let through: not a new opening
	}
	summary := "the half-open probe failed"
	if e.OldState == circuitbreaker.ClosedState {
		// Not e.Metrics(): it reads the old state's statistics without the
		// breaker's lock while attempts in flight record into them. The open
		// state holds the same statistics, and the breaker locks.
		m := s.breaker.Metrics()
		summary = fmt.Sprintf("%d of %d attempts failed", m.Failures(), m.Executions())
	}
	reason := s.failures.opened(summary)
	s.h.emit(Event{Kind: EventCircuitOpened, Host: s.host, Err: reason})
}

func (s *hostState) onHalfOpen(circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitHalfOpen))
	if s.probe.quiet.Load() {
		return
	}
	s.h.emit(Event{Kind: EventCircuitHalfOpened, Host: s.host})
}

func (s *hostState) onClose(circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitClosed))
	s.failures.reset() // a closed circuit counts afresh, and so explains afresh
	s.h.emit(Event{Kind: EventCircuitClosed, Host: s.host})
}
