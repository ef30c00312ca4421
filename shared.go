package resilience

import (
	"errors"
	"reflect"
)

// paceShared takes a permit of the shared rate sr, waiting for it when
// RateLimitOptions.Wait says so and it is due before the call's deadline.
func (c *call) paceShared(sr SharedRate) error {
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
				return c.rateRefused(limitShared, rle.RetryAfter, nil)
			}
			c.emit(Event{Kind: EventRateLimited, Err: err})
			return c.errorf(ErrRateLimited, err, "because the %s rate's store failed", limitShared)
		}
		c.s.sharedFallback(c, res.Fallback)
		if res.Wait <= 0 {
			return nil
		}
		if err := c.pace(limitShared, res.Wait, nil); err != nil {
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
