package resilience

import (
	"errors"
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
)

// admission is a call's hold on its host's concurrency limit.
type admission struct {
	permit bool // holds a bulkhead permit
	queued bool // waited in the admission queue
}

// admit takes a concurrency permit, waiting in the queue if there is room
// there, and a rate permit.
func (c *call) admit() error {
	h, s := c.h, c.s
	if s.bulkhead != nil {
		if !s.bulkhead.TryAcquirePermit() {
			if err := c.queue(); err != nil {
				return err
			}
		}
		c.permit = true
	}
	if s.limiter != nil && !s.limiter.TryAcquirePermit() {
		c.releasePermit()
		c.emit(Event{Kind: EventRateLimited})
		return c.errorf(ErrRateLimited, nil, "over %g requests per second", h.cfg.RateLimit.RequestsPerSecond)
	}
	return nil
}

func (c *call) queue() error {
	h, s := c.h, c.s
	reject := func(detail string, cause error) error {
		c.emit(Event{Kind: EventRateLimited, Err: cause})
		return c.errorf(ErrRateLimited, cause, "%s", detail)
	}
	max := int64(h.cfg.RateLimit.MaxQueue)
	defer s.queued.Add(-1)
	if s.queued.Add(1) > max {
		return reject(fmt.Sprintf("%d calls in flight and %d queued", h.cfg.RateLimit.MaxConcurrent, max), nil)
	}
	var err error
	if c.totalAt.IsZero() {
		err = s.bulkhead.AcquirePermit(c.req.Context())
	} else {
		err = s.bulkhead.AcquirePermitWithMaxWait(c.req.Context(), time.Until(c.totalAt))
	}
	switch {
	case err == nil:
		c.queued = true
		return nil
	case errors.Is(err, bulkhead.ErrFull):
		return reject("queued for admission until the total timeout", ErrTotalTimeout)
	}
	return c.errorf(nil, err, "queued for admission")
}

func (c *call) releasePermit() {
	if c.permit {
		c.permit = false
		c.s.bulkhead.ReleasePermit()
	}
}
