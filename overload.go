package resilience

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"syscall"
	"time"
)

// OverloadStats is a snapshot of one upstream's overload limiter. Latency
// is the smoothed time to headers of successful attempts.
//
// In JSON, as a health report serves it, the latency is a number of
// milliseconds named latencyMs (to the microsecond, such as 53.217), and the
// other fields keep their names in lower camel case: limit, inFlight,
// queued, refused, overloaded.
type OverloadStats struct {
	Limit      int           // attempts allowed in flight
	InFlight   int           // attempts in flight
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
			out[s.host] = l.stats()
		}
	}
	return out
}

// stats is the limiter's state now, for OverloadStats.
func (l *overloadLimiter) stats() OverloadStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return OverloadStats{Limit: l.limitLocked(), InFlight: l.inflight, Queued: len(l.waiters), Latency: l.srtt, Refused: l.refused,
		Overloaded: !l.refusedAt.IsZero() && l.now().Sub(l.refusedAt) < quietAfter}
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

// takeSlot takes a slot of s's overload limiter for the call's attempt n,
// if the limiter is on: at now, unless it waits for one. A first attempt, or a retry while the limiter is
// not shedding, waits for one (queue), at most MaxQueueWait and never past
// the call's deadline; a hedge only tries. ctx is the attempt's. A refusal
// is reported (EventOverloadShed, to rec: record) and returned: an
// *OverloadError, or ctx's error if the caller left while waiting.
func (c *call) takeSlot(ctx context.Context, s *hostState, n int, queue bool, now time.Time, rec *attemptEvents) (overloadSlot, error) {
	l := s.policies.Load().overload
	if l == nil {
		return overloadSlot{}, nil
	}
	var wait time.Duration
	var until time.Time
	if queue {
		wait, until = l.opts.MaxQueueWait, c.deadline()
	}
	slot, err := l.acquire(ctx, wait, until, n, now)
	if err == nil && !l.reported.Load() {
		return slot, nil // only a refusal starts the overloaded state, and it ends only once started
	}
	var oe *OverloadError
	if errors.As(err, &oe) {
		c.record(rec, Event{Kind: EventOverloadShed, Host: s.host, Attempt: n, Err: oe})
	}
	if now, changed := l.overloaded(); changed {
		kind := EventOverloadEnded
		if now {
			kind = EventOverloaded
		}
		e := Event{Kind: kind, Host: s.host}
		if oe != nil {
			e.Err = oe
		}
		c.h.emit(e)
	}
	return slot, err
}

// overloadOutcome is what an attempt's end tells the limiter.
type overloadOutcome int

const (
	overloadAnswered overloadOutcome = iota // response headers: a latency sample
	overloadLoss                            // 503, 429, refused connection: the cap shrinks; no latency sample
	overloadTimeout                         // the attempt timed out: the cap shrinks, and its duration is the sample
	overloadDropped                         // the caller or the call gave up, or the request failed: says nothing
)

// overloadOutcome is what an attempt that ended with resp and err (fired: the
// deadline that cut it, if any) tells the overload limiter.
func (c *call) overloadOutcome(resp *http.Response, err, fired error) overloadOutcome {
	switch {
	case fired == ErrAttemptTimeout:
		return overloadTimeout
	case fired != nil || c.callerLeft() != nil:
		return overloadDropped
	case err != nil:
		if errors.Is(err, syscall.ECONNREFUSED) {
			return overloadLoss
		}
		return overloadDropped
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		return overloadLoss
	}
	return overloadAnswered
}

// overloadFailure is the error of a call whose first attempt the limiter
// refused.
func (c *call) overloadFailure(err error) error {
	if errors.Is(err, ErrOverloaded) {
		return c.errorf(nil, err, "")
	}
	return c.errorf(nil, err, "waiting for a slot")
}
