package resilience

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Health is a report of handlers' circuits, for a health endpoint. Its
// Status is "degraded" while a circuit is not closed or an overload limiter
// refuses calls, and "healthy" otherwise.
type Health struct {
	Status   string                   `json:"status"`
	Handlers map[string]HandlerHealth `json:"handlers"`
}

// HandlerHealth is one handler's part of a Health report: its circuit
// (closed, half-open, open or isolated), why it opened while not closed,
// and its overload limiter's OverloadStats while the limiter is on. With
// PerHost or Endpoints, Hosts and OverloadByHost hold each host's.
type HandlerHealth struct {
	Circuit        string                   `json:"circuit"`
	Reason         string                   `json:"reason,omitempty"`
	Hosts          map[string]string        `json:"hosts,omitempty"`
	Overload       *OverloadStats           `json:"overload,omitempty"`
	OverloadByHost map[string]OverloadStats `json:"overloadByHost,omitempty"`
}

// CheckHealth reports the circuit state of each handler.
func CheckHealth(handlers ...*Handler) Health {
	report := Health{Status: "healthy", Handlers: make(map[string]HandlerHealth, len(handlers))}
	for _, h := range handlers {
		state := h.CircuitState()
		hh := HandlerHealth{Circuit: state.String()}
		if state != CircuitClosed {
			report.Status = "degraded"
			hh.Reason = openReason(h)
		}
		if hosts := h.HostCircuitStates(); hosts != nil {
			hh.Hosts = make(map[string]string, len(hosts))
			for host, s := range hosts {
				hh.Hosts[host] = s.String()
			}
		}
		for host, st := range h.OverloadStats() {
			if host == "" { // the handler's own: no PerHost, no Endpoints
				hh.Overload = &st
			} else {
				if hh.OverloadByHost == nil {
					hh.OverloadByHost = make(map[string]OverloadStats)
				}
				hh.OverloadByHost[host] = st
			}
			if st.Overloaded {
				report.Status = "degraded" // calls fail fast or are shed, as with an open circuit
			}
		}
		report.Handlers[h.Name()] = hh
	}
	return report
}

// HealthHandler returns an http.Handler that serves CheckHealth of the
// handlers as JSON, with status 200 even when degraded.
func HealthHandler(handlers ...*Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(CheckHealth(handlers...))
	})
}

// openReason says why h's circuit is not closed.
func openReason(h *Handler) string {
	if h.isolated.Load() {
		return strings.TrimPrefix(ErrIsolated.Error(), "resilience: ")
	}
	for _, s := range h.states() {
		if s.circuitState() != CircuitClosed {
			if r := s.circuit.Reason(); r != nil {
				if s.host != "" {
					return s.host + ": " + r.Error()
				}
				return r.Error()
			}
		}
	}
	return ""
}
