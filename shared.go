package resilience

import (
	"context"
	"errors"
	"reflect"
	"time"
)

// A SharedRate is a rate that several processes share through a store,
// such as redislimit's Redis-backed limiter: the handler asks it for a
// permit of every call it admits, after the concurrency limit and the
// local rate. Any store can implement it; it must be safe for concurrent
// use.
//
// There is no reservation to cancel: Take either hands over a permit now
// or hands over nothing and says when the next one is due. A caller that
// waits (RateLimitOptions.Wait) sleeps until then, within its deadline,
// and asks again; a caller that leaves while waiting has taken nothing.
// A permit taken is spent, even if the call then fails or is cancelled.
type SharedRate interface {
	// Take takes one permit of the rate named key, which the handler
	// builds: its name, then a space and the authority
	// (scheme://host:port) with per-host isolation.
	//
	// A zero Wait gives the caller its permit. A positive Wait gives it
	// none and says when the next permit is due, as a Retry-After would;
	// another process may take that one first.
	//
	// An error refuses the call under ErrRateLimited: the handler cannot
	// know what share of the rate would be safe to use alone, so a store
	// that can answer without its backend does so itself and reports it
	// in SharedRateResult.Fallback. An error of ctx is the caller's.
	Take(ctx context.Context, key string) (SharedRateResult, error)
}

// A SharedRateResult is a SharedRate's answer to Take.
type SharedRateResult struct {
	// Wait is zero when the caller has its permit; otherwise it has
	// none, and the next permit is due in Wait.
	Wait time.Duration

	// Fallback, when not nil, says that the store answered from a local
	// rate of its own rather than the shared one, and why: its backend
	// is slow or unreachable. The handler emits EventSharedRateFallback
	// when a key's answers start carrying it and EventSharedRateRecovered
	// when they stop.
	Fallback error
}

// paceShared takes a permit of the shared rate sr, waiting for it when
// RateLimitOptions.Wait says so and it is due before the call's deadline.
func (c admitting) paceShared(sr SharedRate) error {
	key := c.cfg.Name
	if c.s.host != "" {
		key += " " + c.s.host
	}
	ctx := c.req.Context()
	for {
		res, err := sr.Take(ctx, key)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return c.errorf(nil, err, "waiting for a %s rate permit", limitShared)
			}
			var rle *RateLimitError
			if errors.As(err, &rle) {
				return c.rateRefused(limitShared, rle.RetryAfter)
			}
			c.emit(Event{Kind: EventRateLimited, Err: err})
			return c.errorf(ErrRateLimited, err, "the %s rate's store failed", limitShared)
		}
		c.s.sharedFallback(c.call, res.Fallback)
		if res.Wait <= 0 {
			return nil
		}
		if err := c.pace(limitShared, res.Wait); err != nil {
			return err
		}
	}
}

// sharedFallback emits the event of a change between the shared rate and
// the store's local fallback, once per change and host.
func (s *hostState) sharedFallback(c *call, why error) {
	local := why != nil
	if s.sharedLocal.Load() == local || !s.sharedLocal.CompareAndSwap(!local, local) {
		return
	}
	if local {
		c.emit(Event{Kind: EventSharedRateFallback, Err: why})
	} else {
		c.emit(Event{Kind: EventSharedRateRecovered})
	}
}

// sameRateOptions reports whether a == b without the panic that == would
// raise on a Shared whose dynamic type is not comparable (such a Shared is
// taken as changed).
func sameRateOptions(a, b RateLimitOptions) bool {
	sa, sb := a.Shared, b.Shared
	a.Shared, b.Shared = nil, nil
	if a != b {
		return false
	}
	if sa == nil || sb == nil {
		return sa == nil && sb == nil
	}
	return reflect.TypeOf(sa).Comparable() && reflect.TypeOf(sb).Comparable() && sa == sb
}
