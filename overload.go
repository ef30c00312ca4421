package resilience

import (
	"fmt"
	"time"
)

// OverloadStats is a snapshot of one upstream's overload limiter. Latency
// is the smoothed time to headers of successful attempts.
type OverloadStats struct {
	Limit      int           `json:"limit"`      // attempts allowed in flight
	InFlight   int           `json:"inFlight"`   // attempts in flight
	Queued     int           `json:"queued"`     // first attempts waiting
	Latency    time.Duration `json:"latency"`    // smoothed time to headers
	Refused    uint64        `json:"refused"`    // refusals and sheds so far
	Overloaded bool          `json:"overloaded"` // it refused one within 1s
}

// OverloadStats returns a snapshot of the overload limiter, by host with
// PerHost or Endpoints and under "" without, or nil when it is off.
func (h *Handler) OverloadStats() map[string]OverloadStats {
	states := h.states()
	routed := h.cfg.Load().route != nil
	var out map[string]OverloadStats
	for _, s := range states {
		if routed && s == h.shared {
			continue // every attempt goes to an endpoint's limiter
		}
		if l := s.policies.Load().overload; l != nil {
			if out == nil {
				out = make(map[string]OverloadStats, len(states))
			}
			out[s.host] = l.stats()
		}
	}
	return out
}

// OverloadError is why the overload limiter refused a call, at its limit
// with the queue full or the wait too long. It is ErrOverloaded for errors.Is.
type OverloadError struct {
	Limit    int           // attempts allowed in flight when it refused
	InFlight int           // attempts in flight then
	Latency  time.Duration // smoothed time to headers of successes
	Waited   time.Duration // how long the call waited for a slot
}

func (e *OverloadError) Error() string {
	return fmt.Sprintf("resilience: upstream overloaded: %d attempts in flight, limit %d, latency %v, waited %v",
		e.InFlight, e.Limit, e.Latency.Round(time.Microsecond), e.Waited.Round(time.Microsecond))
}

// Is reports whether target is ErrOverloaded.
func (e *OverloadError) Is(target error) bool { return target == ErrOverloaded }
