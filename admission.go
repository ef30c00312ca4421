package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"

	"github.com/resilienthttp/resilience/internal/overload"
)

// admit takes a concurrency permit, waiting in the queue if there is room
// there, and a rate permit, and reports whether the call waited or may
// have (a rate it paces by, which may have held it): the clock is read
// again then, for the first attempt's start. The permit
// is given back to the gate it came from, even if an Update has
// replaced that gate since.
func (c *call) admit() (queued bool, err error) {
	p := c.s.policies.Load()
	if g := p.bulkhead; g != nil {
		if !g.tryAcquire() {
			if err := c.queue(g); err != nil {
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
		if err := c.paceShared(sr); err != nil {
			c.releasePermit()
			return false, err
		}
	}
	return queued, nil
}

func (c *call) queue(g *gate) error {
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
	switch err := g.wait(c.req.Context(), c.totalAt); {
	case err == nil:
		return nil
	case err == errGateTimeout:
		return reject("after waiting for admission", ErrTotalTimeout)
	default:
		return c.errorf(nil, err, "queued for admission")
	}
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
		p.bulkhead.release()
	}
}

// A gate caps the calls in flight to a host (RateLimit.MaxConcurrent) and
// hands a permit given back to the call that has waited longest for one
// (RateLimit.MaxQueue; queue counts them). It does what failsafe-go's
// bulkhead does, which is a buffered channel: a send to take a permit and
// a receive to give it back cost 351 instructions per call in
// BenchmarkOverhead (bench/instructions.sh), 6 % of all the handler adds
// to a call; a gate's atomic counter costs a few dozen.
type gate struct {
	max     int64
	lent    atomic.Int64 // permits out, those handed on to a waiter included
	waiting atomic.Int64 // len(queue), read without mu
	mu      sync.Mutex
	queue   []chan struct{} // closed when a permit is handed to its waiter
}

// errGateTimeout is why wait gave up: the deadline it was given passed.
var errGateTimeout = errors.New("resilience: no admission permit before the deadline")

func newGate(max int) *gate { return &gate{max: int64(max)} }

// tryAcquire takes a permit if one is free and no call waits for one.
func (g *gate) tryAcquire() bool {
	return g.waiting.Load() == 0 && g.take()
}

func (g *gate) take() bool {
	for {
		n := g.lent.Load()
		if n >= g.max {
			return false
		}
		if g.lent.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release gives a permit back, to the longest waiter if any waits.
func (g *gate) release() {
	g.lent.Add(-1)
	if g.waiting.Load() > 0 {
		// A waiter that queued after this load took its own look at lent
		// after queuing (wait), and found the permit given back above.
		g.mu.Lock()
		g.handOnLocked()
		g.mu.Unlock()
	}
}

// handOnLocked gives free permits to waiters, oldest first. g.mu is held.
func (g *gate) handOnLocked() {
	for len(g.queue) > 0 && g.take() {
		close(g.queue[0])
		g.queue[0] = nil
		g.queue = g.queue[1:]
		g.waiting.Add(-1)
	}
}

// wait takes a permit, waiting in line until ctx is done or until
// deadline (none if zero), when it fails with ctx's error or
// errGateTimeout.
func (g *gate) wait(ctx context.Context, deadline time.Time) error {
	ready := make(chan struct{})
	g.mu.Lock()
	g.queue = append(g.queue, ready)
	g.waiting.Add(1)
	g.handOnLocked() // a permit given back before this waiter queued
	g.mu.Unlock()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = errGateTimeout
	}
	g.mu.Lock()
	if i := slices.Index(g.queue, ready); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		g.waiting.Add(-1)
		g.mu.Unlock()
		return err
	}
	g.mu.Unlock()
	g.release() // handed one as it gave up: it goes to the next in line
	return err
}

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

// takeSlot takes a slot of the overload limiter of a's host for a, if the
// limiter is on: at now, unless it waits for one. A first attempt, or a
// retry while the limiter is not shedding, waits for one (a.queue), at
// most MaxQueueWait and never past the call's deadline less the recent
// time to headers (overload.Limiter.Acquire); a hedge only
// tries. A retry (a hedge that follows a failure is one) is shed while the
// upstream is sluggish; a hedge sent while an earlier attempt runs
// (a.hedge) is not. A refusal is reported (EventOverloadShed, to a.rec:
// record) and returned: an *OverloadError, or the attempt context's error
// if the caller left while waiting.
func (a *attempt) takeSlot(now time.Time) (overload.Slot, error) {
	c, s, n := a.c, a.s, a.n
	p := s.policies.Load()
	l := p.overload
	if l == nil {
		return overload.Slot{}, nil
	}
	var wait time.Duration
	var until time.Time
	if a.queue {
		wait, until = p.ov.MaxQueueWait, c.deadline()
	}
	kind := overload.Retry
	switch {
	case n == 1:
		kind = overload.First
	case a.hedge:
		kind = overload.Hedge
	}
	slot, err := l.Acquire(a.ctx, wait, until, kind, now)
	if err == nil && !l.Reported() {
		return slot, nil // only a refusal starts the overloaded state, and it ends only once started
	}
	var oe *OverloadError
	if r, ok := err.(*overload.Refusal); ok {
		oe = (*OverloadError)(r) // the same fields
		err = oe
		c.record(a.rec, Event{Kind: EventOverloadShed, Host: s.host, Attempt: n, Err: oe})
	}
	if now, changed := l.Overloaded(); changed {
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

// overloadOutcome is what an attempt that ended with resp and err (fired: the
// deadline that cut it, if any; held: it outlived its limit, queued behind
// others) tells the overload limiter. One held until the call ended timed
// out as surely as one cut at its limit.
func (c *call) overloadOutcome(resp *http.Response, err, fired error, held bool) overload.Outcome {
	switch {
	case fired == ErrAttemptTimeout:
		return overload.Timeout
	case held && err != nil:
		return overload.Timeout
	case fired != nil || c.callerLeft() != nil:
		return overload.Dropped
	case err != nil:
		if errors.Is(err, syscall.ECONNREFUSED) {
			return overload.Loss
		}
		return overload.Dropped
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		return overload.Loss
	}
	return overload.Answered
}

// overloadFailure is the error of a call whose first attempt the limiter
// refused.
func (c *call) overloadFailure(err error) error {
	if errors.Is(err, ErrOverloaded) {
		return c.errorf(nil, err, "")
	}
	return c.errorf(nil, err, "waiting for a slot")
}
