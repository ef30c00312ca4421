package resilience

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
)

// A Handler is the resilience stack of one upstream: its circuit breaker,
// its concurrency and rate limits, its name and its events. It is safe for
// concurrent use; share one Handler among all the clients that call the same
// upstream so that they share its state.
type Handler struct {
	cfg *config

	breaker  circuitbreaker.CircuitBreaker[any] // nil when disabled
	bulkhead bulkhead.Bulkhead[any]             // nil when disabled
	limiter  ratelimiter.RateLimiter[any]       // nil without a rate
	queued   atomic.Int64                       // calls waiting for a bulkhead permit

	timers sync.Pool // *timerSlot, reused from call to call

	isolated atomic.Bool
	circuit  atomic.Int32 // CircuitState as the breaker's listeners last saw it
	failures failureLog
}

// NewHandler validates opts, fills in defaults, and returns the Handler
// they describe. An invalid option is an error that names the field.
func NewHandler(opts Options) (*Handler, error) {
	cfg, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg}
	h.timers.New = newTimerSlot
	if rl := cfg.RateLimit; !rl.Disabled {
		h.bulkhead = bulkhead.New[any](uint(rl.MaxConcurrent))
		if rl.RequestsPerSecond > 0 {
			h.limiter = newRateLimiter(rl.RequestsPerSecond, rl.Burst)
		}
	}
	if cb := cfg.CircuitBreaker; !cb.Disabled {
		h.breaker = circuitbreaker.NewBuilder[any]().
			WithFailureRateThreshold(cb.FailureRatio, uint(cb.MinimumThroughput), cb.SamplingDuration).
			WithDelay(cb.BreakDuration).
			WithSuccessThreshold(1). // half-open admits one probe, as Polly does
			OnOpen(h.onOpen).
			OnHalfOpen(h.onHalfOpen).
			OnClose(h.onClose).
			Build()
	}
	return h, nil
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

// Name returns the handler's name, as used in errors, events and logs.
func (h *Handler) Name() string { return h.cfg.Name }

// Transport returns an http.RoundTripper that sends requests through base
// (http.DefaultTransport when nil) under this handler. Transports of one
// Handler share its state.
func (h *Handler) Transport(base http.RoundTripper) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{h: h, base: base}
}

// CircuitState is the state of a handler's circuit.
type CircuitState int32

// Circuit states.
const (
	CircuitClosed   CircuitState = iota // calls flow; failures are counted
	CircuitOpen                         // calls are rejected until BreakDuration has passed
	CircuitHalfOpen                     // one probe is let through to test recovery
	CircuitIsolated                     // held open by IsolateCircuit until CloseCircuit
)

func (s CircuitState) String() string {
	switch s {
	case CircuitClosed:
		return "closed"
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half-open"
	case CircuitIsolated:
		return "isolated"
	}
	return "unknown"
}

// CircuitState reports the state of the handler's circuit. An open circuit
// whose BreakDuration has passed reports CircuitHalfOpen: the next call will
// be its probe. A handler without a circuit breaker is always closed unless
// isolated.
func (h *Handler) CircuitState() CircuitState {
	if h.isolated.Load() {
		return CircuitIsolated
	}
	if h.breaker == nil {
		return CircuitClosed
	}
	switch h.breaker.State() {
	case circuitbreaker.OpenState:
		if h.breaker.RemainingDelay() <= 0 {
			return CircuitHalfOpen
		}
		return CircuitOpen
	case circuitbreaker.HalfOpenState:
		return CircuitHalfOpen
	}
	return CircuitClosed
}

// IsolateCircuit holds the circuit open until CloseCircuit is called: every
// call is rejected with ErrCircuitOpen without reaching the upstream, as for
// a known maintenance window. It works even when the circuit breaker is
// disabled.
func (h *Handler) IsolateCircuit() {
	if !h.isolated.Swap(true) {
		h.emit(Event{Kind: EventCircuitOpened, Err: errIsolated})
	}
}

// CloseCircuit ends an isolation and closes the circuit, forgetting the
// failures counted so far.
func (h *Handler) CloseCircuit() {
	wasIsolated := h.isolated.Swap(false)
	if h.breaker != nil && !h.breaker.IsClosed() {
		h.breaker.Close() // the OnClose listener emits the event
		return
	}
	if wasIsolated {
		h.emit(Event{Kind: EventCircuitClosed})
	}
}

func (h *Handler) onOpen(e circuitbreaker.StateChangedEvent) {
	h.circuit.Store(int32(CircuitOpen))
	summary := "the half-open probe failed"
	if e.OldState == circuitbreaker.ClosedState {
		// Not e.Metrics(): it reads the old state's statistics without the
		// breaker's lock while attempts in flight record into them. The open
		// state holds the same statistics, and the breaker locks.
		m := h.breaker.Metrics()
		summary = fmt.Sprintf("%d of %d attempts failed", m.Failures(), m.Executions())
	}
	reason := h.failures.opened(summary)
	h.emit(Event{Kind: EventCircuitOpened, Err: reason})
}

func (h *Handler) onHalfOpen(circuitbreaker.StateChangedEvent) {
	h.circuit.Store(int32(CircuitHalfOpen))
	h.emit(Event{Kind: EventCircuitHalfOpened})
}

func (h *Handler) onClose(circuitbreaker.StateChangedEvent) {
	h.circuit.Store(int32(CircuitClosed))
	h.failures.reset() // a closed circuit counts afresh, and so explains afresh
	h.emit(Event{Kind: EventCircuitClosed})
}

// EventKind says what happened.
type EventKind int

// Event kinds.
const (
	EventRetry             EventKind = iota + 1 // an attempt failed and another follows after Delay
	EventAttemptTimeout                         // an attempt got no headers within AttemptTimeout
	EventTotalTimeout                           // the call ran out of TotalTimeout
	EventCircuitOpened                          // the circuit opened (Err says why) or was isolated
	EventCircuitHalfOpened                      // the circuit lets a probe through
	EventCircuitClosed                          // the circuit closed
	EventCircuitRejected                        // a call was rejected by the open circuit
	EventRateLimited                            // a call was rejected by admission control
)

func (k EventKind) String() string {
	switch k {
	case EventRetry:
		return "retry"
	case EventAttemptTimeout:
		return "attempt_timeout"
	case EventTotalTimeout:
		return "total_timeout"
	case EventCircuitOpened:
		return "circuit_opened"
	case EventCircuitHalfOpened:
		return "circuit_half_opened"
	case EventCircuitClosed:
		return "circuit_closed"
	case EventCircuitRejected:
		return "circuit_rejected"
	case EventRateLimited:
		return "rate_limited"
	}
	return "unknown"
}

// An Event is something the handler did or saw.
type Event struct {
	Handler    string        // the handler's name
	Kind       EventKind     // what happened
	Method     string        // the request's method, for events about a call
	Attempt    int           // the attempt it concerns, counting from 1; 0 for circuit transitions
	Delay      time.Duration // for EventRetry, the wait before the next attempt
	StatusCode int           // the response status it concerns, if any
	Err        error         // the error it concerns, if any; for EventCircuitOpened, why
}

// level is the slog level an event is logged at.
func (k EventKind) level() slog.Level {
	switch k {
	case EventRetry:
		return slog.LevelWarn
	case EventCircuitClosed, EventCircuitHalfOpened:
		return slog.LevelInfo
	}
	return slog.LevelError
}

func (h *Handler) observed() bool { return h.cfg.OnEvent != nil || h.cfg.Logger != nil }

func (h *Handler) emit(e Event) {
	if !h.observed() {
		return
	}
	e.Handler = h.cfg.Name
	if h.cfg.OnEvent != nil {
		h.cfg.OnEvent(e)
	}
	if l := h.cfg.Logger; l != nil {
		lvl := e.Kind.level()
		if !l.Enabled(context.Background(), lvl) {
			return
		}
		attrs := make([]slog.Attr, 0, 6)
		attrs = append(attrs, slog.String("handler", e.Handler), slog.String("event", e.Kind.String()))
		if e.Method != "" {
			attrs = append(attrs, slog.String("method", e.Method))
		}
		if e.Attempt > 0 {
			attrs = append(attrs, slog.Int("attempt", e.Attempt))
		}
		if e.Kind == EventRetry {
			attrs = append(attrs, slog.Duration("delay", e.Delay))
		}
		if e.StatusCode != 0 {
			attrs = append(attrs, slog.Int("status", e.StatusCode))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		l.LogAttrs(context.Background(), lvl, "resilience: "+e.Kind.String(), attrs...)
	}
}
