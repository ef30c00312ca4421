package resilience

import (
	"context"
	"log/slog"
	"time"
)

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
	Host       string        // with PerHost, the authority (scheme://host:port) it concerns
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
