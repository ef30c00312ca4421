package resilience

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/resilienthttp/resilience/internal/overload"
)

// Defaults of OverloadOptions: what a zero field means.
const (
	defaultOverloadMinLimit     = 8
	defaultOverloadMaxLimit     = 1000
	defaultOverloadInitialLimit = 20
	defaultOverloadMaxQueue     = 1000
	defaultOverloadMaxQueueWait = 30 * time.Second
)

// OverloadOptions configures the overload limiter: an adaptive limit on the
// attempts awaiting headers from the upstream, by their latency and losses.
// A call whose first attempt gets no slot in time fails with
// [ErrOverloaded]; a retry or hedge may be shed. See docs/overload.md.
type OverloadOptions struct {
	Disabled     bool          // turns the limiter off; default false
	MinLimit     int           // fewest attempts in flight allowed, per process (a fleet's floor is replicas × MinLimit); default 8, or less to fit MaxLimit and InitialLimit
	MaxLimit     int           // most allowed, at most 1000000; default 1000, or more to fit MinLimit and InitialLimit
	InitialLimit int           // where the limit starts; default 20, within MinLimit and MaxLimit
	MaxQueue     int           // how many attempts may wait; default 1000
	MaxQueueWait time.Duration // longest wait for a slot, never past the call's deadline less the recent time to headers; default 30s
}

var overloadFields = fieldSet[OverloadOptions]{
	"disabled": boolField(func(o *OverloadOptions) *bool { return &o.Disabled }),
	"minLimit": intField(func(o *OverloadOptions) *int { return &o.MinLimit },
		keepZero),
	"maxLimit": intField(func(o *OverloadOptions) *int { return &o.MaxLimit },
		keepZero),
	"initialLimit": intField(func(o *OverloadOptions) *int { return &o.InitialLimit },
		keepZero),
	"maxQueue": intField(func(o *OverloadOptions) *int { return &o.MaxQueue },
		keepZero),
	"maxQueueWait": durationField(func(o *OverloadOptions) *time.Duration { return &o.MaxQueueWait },
		keepZero),
}

// resolveOverload fills in the overload limiter's defaults and validates
// it, even when it is disabled, since a live Update may switch it on.
func resolveOverload(ov *OverloadOptions, bad badOption) error {
	// Update may switch it on.
	switch {
	case ov.MinLimit < 0:
		return bad("Overload.MinLimit", ov.MinLimit, "must not be negative")
	case ov.MaxLimit < 0:
		return bad("Overload.MaxLimit", ov.MaxLimit, "must not be negative")
	case ov.InitialLimit < 0:
		return bad("Overload.InitialLimit", ov.InitialLimit, "must not be negative")
	case ov.MaxQueue < 0:
		return bad("Overload.MaxQueue", ov.MaxQueue, "must not be negative")
	case ov.MaxQueueWait < 0:
		return bad("Overload.MaxQueueWait", ov.MaxQueueWait, "must not be negative")
	}
	const most = 1_000_000
	switch {
	case ov.MinLimit > most:
		return bad("Overload.MinLimit", ov.MinLimit, "must be at most 1000000")
	case ov.MaxLimit > most:
		return bad("Overload.MaxLimit", ov.MaxLimit, "must be at most 1000000")
	case ov.InitialLimit > most:
		return bad("Overload.InitialLimit", ov.InitialLimit, "must be at most 1000000")
	}
	// Each default limit yields to the explicit ones it would contradict:
	// MinLimit is 8 or an explicit MaxLimit or InitialLimit under it,
	// MaxLimit 1000 or an explicit MinLimit or InitialLimit above it, and
	// InitialLimit 20 within the two.
	given := *ov
	if given.MinLimit == 0 {
		ov.MinLimit = defaultOverloadMinLimit
		for _, v := range []int{given.MaxLimit, given.InitialLimit} {
			if v > 0 {
				ov.MinLimit = min(ov.MinLimit, v)
			}
		}
	}
	if given.MaxLimit == 0 {
		ov.MaxLimit = max(defaultOverloadMaxLimit, given.MinLimit, given.InitialLimit)
	}
	if given.InitialLimit == 0 {
		ov.InitialLimit = min(max(defaultOverloadInitialLimit, ov.MinLimit), ov.MaxLimit)
	}
	if ov.MaxQueue == 0 {
		ov.MaxQueue = defaultOverloadMaxQueue
	}
	if ov.MaxQueueWait == 0 {
		ov.MaxQueueWait = defaultOverloadMaxQueueWait
	}
	// Only explicit values can contradict each other here.
	switch {
	case ov.MinLimit > ov.MaxLimit:
		return bad("Overload.MinLimit", ov.MinLimit, fmt.Sprintf("must not exceed Overload.MaxLimit (%d)", ov.MaxLimit))
	case ov.InitialLimit < ov.MinLimit:
		return bad("Overload.InitialLimit", ov.InitialLimit, fmt.Sprintf("must not be below Overload.MinLimit (%d)", ov.MinLimit))
	case ov.InitialLimit > ov.MaxLimit:
		return bad("Overload.InitialLimit", ov.InitialLimit, fmt.Sprintf("must not exceed Overload.MaxLimit (%d)", ov.MaxLimit))
	}
	return nil
}

// OverloadStats is a snapshot of one upstream's overload limiter. Latency
// is the smoothed time to headers of successful attempts.
//
// In JSON, as a health report serves it, the latency is a number of
// milliseconds named latencyMs (to the microsecond, such as 53.217), and the
// other fields keep their names in lower camel case: limit, inFlight,
// queued, refused, overloaded.
type OverloadStats struct {
	Limit      int           // attempts allowed in flight
	InFlight   int           // attempts in flight holding a slot (not those sent with none after the upstream stalled)
	Queued     int           // first attempts waiting
	Latency    time.Duration // smoothed time to headers
	Refused    uint64        // refusals and sheds so far
	Overloaded bool          // it refused one within 1s
}

// overloadStatsJSON is OverloadStats as JSON: a duration carries its unit.
type overloadStatsJSON struct {
	Limit      int     `json:"limit"`
	InFlight   int     `json:"inFlight"`
	Queued     int     `json:"queued"`
	LatencyMs  float64 `json:"latencyMs"`
	Refused    uint64  `json:"refused"`
	Overloaded bool    `json:"overloaded"`
}

// MarshalJSON encodes s with its latency in milliseconds, as latencyMs.
func (s OverloadStats) MarshalJSON() ([]byte, error) {
	return json.Marshal(overloadStatsJSON{Limit: s.Limit, InFlight: s.InFlight, Queued: s.Queued,
		LatencyMs: float64(s.Latency.Round(time.Microsecond)) / float64(time.Millisecond),
		Refused:   s.Refused, Overloaded: s.Overloaded})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (s *OverloadStats) UnmarshalJSON(data []byte) error {
	var j overloadStatsJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	if j.LatencyMs < 0 || j.LatencyMs > float64(math.MaxInt64/int64(time.Millisecond)) {
		return fmt.Errorf("resilience: overload stats: latencyMs %v is out of range", j.LatencyMs)
	}
	*s = OverloadStats{Limit: j.Limit, InFlight: j.InFlight, Queued: j.Queued,
		Latency: time.Duration(math.Round(j.LatencyMs * float64(time.Millisecond))),
		Refused: j.Refused, Overloaded: j.Overloaded}
	return nil
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
			out[s.host] = OverloadStats(l.Stats()) // the same fields
		}
	}
	return out
}

// OverloadError is why the overload limiter refused a call, at its limit
// with the queue full or the wait too long, or a retry (Usual > 0). It is
// ErrOverloaded for errors.Is.
type OverloadError struct {
	Limit    int           // attempts allowed in flight when it refused
	InFlight int           // attempts in flight then
	Latency  time.Duration // smoothed time to headers of successes; with Usual, of the last few
	Waited   time.Duration // how long the call waited for a slot
	Usual    time.Duration // usual time to headers, when Latency is far over it and a retry was shed
}

func (e *OverloadError) Error() string { return (*overload.Refusal)(e).Error() }

// Is reports whether target is ErrOverloaded.
func (e *OverloadError) Is(target error) bool { return target == ErrOverloaded }
