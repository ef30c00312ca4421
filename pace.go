package resilience

import (
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
)

// Rates: a call over a rate waits for its permit when RateLimitOptions.Wait
// says so and the permit is due before the call's deadline; otherwise it
// fails at once with a *RateLimitError under ErrRateLimited.

// Names of the rates a call can be refused by, for RateLimitError.Limit.
const (
	limitLocal  = "local"
	limitShared = "shared"
	limitServer = "server"
)

// pace holds the call until the permit of the rate named limit, due in
// wait, or refuses the call; said is the server's answer the refusal of a
// server quota rests on, nil for the other rates. A wait of zero or less
// admits it at once.
func (c *call) pace(limit string, wait time.Duration, said *serverAnswer) error {
	if wait <= 0 {
		return nil
	}
	if c.cfg.RateLimit.Wait {
		if d := c.deadline(); d.IsZero() || time.Now().Add(wait).Before(d) {
			if err := c.sleepUntil(time.Now().Add(wait)); err != nil {
				return c.errorf(nil, err, "waiting for a %s rate permit", limit)
			}
			return nil
		}
	}
	return c.rateRefused(limit, wait, said)
}

// rateRefused is the error, and the event, for a call the rate named
// limit refused; its next permit is due in retryAfter, zero if unknown,
// and said is the server's answer it rests on, if any.
func (c *call) rateRefused(limit string, retryAfter time.Duration, said *serverAnswer) error {
	cause := &RateLimitError{Limit: limit, RetryAfter: max(0, retryAfter)}
	if said != nil {
		cause.Quota, cause.Resource, cause.Response = said.quota, said.resource, said.response(c.req)
	}
	c.emit(Event{Kind: EventRateLimited, Err: cause})
	return c.errorf(ErrRateLimited, cause, "")
}

// paceLocal takes a permit of the handler's own rate, waiting for it when
// RateLimitOptions.Wait says so and it is due before the call's deadline.
func (c *call) paceLocal(l ratelimiter.RateLimiter[any], rl RateLimitOptions) error {
	if !rl.Wait {
		if l.TryAcquirePermit() {
			return nil
		}
		// No caller reserves a permit ahead when none waits, so the next
		// one is due within one interval (one period of Burst calls).
		return c.rateRefused(limitLocal, localPeriod(rl), nil)
	}
	var wait time.Duration
	if d := c.deadline(); d.IsZero() {
		wait = l.ReservePermit()
	} else if wait = l.TryReservePermit(time.Until(d)); wait < 0 {
		return c.rateRefused(limitLocal, 0, nil) // due past the deadline: when, the limiter does not say
	}
	if wait <= 0 {
		return nil
	}
	if err := c.sleepUntil(time.Now().Add(wait)); err != nil {
		return c.errorf(nil, err, "waiting for a %s rate permit", limitLocal)
	}
	return nil
}

// localPeriod is the longest a refused call waits for the next permit of
// rl's rate when no call holds a reservation.
func localPeriod(rl RateLimitOptions) time.Duration {
	interval := time.Duration(float64(time.Second) / rl.RequestsPerSecond)
	if rl.Burst > 1 {
		return interval * time.Duration(rl.Burst)
	}
	return interval
}
