package resilience

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
)

// admit takes a concurrency permit, waiting in the queue if there is room
// there, and a rate permit, and reports whether the call waited or may
// have (a rate it paces by, which may have held it): the clock is read
// again then, for the first attempt's start. The permit
// is given back to the bulkhead it came from, even if an Update has
// replaced that bulkhead since.
func (c *call) admit() (queued bool, err error) {
	p := c.s.policies.Load()
	if bh := p.bulkhead; bh != nil {
		if !bh.TryAcquirePermit() {
			if err := c.queue(bh); err != nil {
				return false, err
			}
			queued = true
		}
		c.permit = p
	}
	if p.limiter != nil {
		queued = true
		if err := c.paceLocal(p.limiter, p.rl); err != nil {
			c.releasePermit()
			return false, err
		}
	}
	if c.cfg.followsServer() && c.s.quota.active.Load() {
		queued = true
	}
	held, err := c.paceServer() // serverquota.go: the server's word first
	if err != nil {
		c.releasePermit()
		return false, err
	}
	queued = queued || held
	if sr := p.rl.Shared; sr != nil && !p.rl.Disabled {
		queued = true
		if err := c.paceShared(sr); err != nil { // shared.go
			c.releasePermit()
			return false, err
		}
	}
	return queued, nil
}

func (c *call) queue(bh bulkhead.Bulkhead[any]) error {
	s := c.s
	reject := func(detail string, cause error) error {
		c.emit(Event{Kind: EventRateLimited, Err: cause})
		return c.errorf(ErrRateLimited, cause, "%s", detail)
	}
	max := int64(c.cfg.RateLimit.MaxQueue)
	defer s.queued.Add(-1)
	if s.queued.Add(1) > max {
		return reject(admissionFull(c.cfg.RateLimit.MaxConcurrent, c.cfg.RateLimit.MaxQueue), nil)
	}
	var err error
	if c.totalAt.IsZero() {
		err = bh.AcquirePermit(c.req.Context())
	} else {
		err = bh.AcquirePermitWithMaxWait(c.req.Context(), time.Until(c.totalAt))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bulkhead.ErrFull):
		return reject("after waiting for admission", ErrTotalTimeout)
	}
	return c.errorf(nil, err, "queued for admission")
}

// admissionFull says why a call found no permit and no room in the queue,
// for "rate limited with ...": 1 call, 2 calls, none queued.
func admissionFull(inFlight, queued int) string {
	calls := "calls"
	if inFlight == 1 {
		calls = "call"
	}
	q := "none"
	if queued > 0 {
		q = strconv.Itoa(queued)
	}
	return fmt.Sprintf("with %d %s in flight and %s queued, the most RateLimit.MaxConcurrent and MaxQueue allow", inFlight, calls, q)
}

func (c *call) releasePermit() {
	if p := c.permit; p != nil {
		c.permit = nil
		p.bulkhead.ReleasePermit()
	}
}
