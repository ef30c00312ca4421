package redislimit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/go-redis/redis_rate/v10"
	"github.com/resilienthttp/resilience"
)

// A bucket is one key's permits in this process: the lease from Redis,
// and the local share for the fallback.
type bucket struct {
	key string // in Redis (redis_rate puts "rate:" before it)

	mu        sync.Mutex
	leased    int        // permits in hand, valid until expires
	expires   time.Time  // when the lease's permits are dropped
	emptiedAt time.Time  // when the last lease ran out, if it did
	batch     int        // permits the next lease asks for
	notBefore time.Time  // Redis refused: no permit is due before
	refill    *redisCall // the lease request in flight; nil if none
	last      time.Time  // last call, to forget idle keys

	local   ratelimiter.RateLimiter[any] // the fallback share; kept across the switches
	localOf int64                        // the replica count local was built for
}

// takeShared hands over a permit from the lease, or asks Redis for a new
// lease. again reports that Redis failed, or that the caller should ask
// once more at once.
func (b *bucket) takeShared(ctx context.Context, l *Limiter, h *health) (res resilience.SharedRateResult, again bool, err error) {
	now := time.Now()
	b.mu.Lock()
	b.last = now
	if b.leased > 0 && now.Before(b.expires) {
		res = b.handOver(l, h, now)
		b.mu.Unlock()
		return res, false, nil
	}
	if c := b.refill; c != nil {
		b.mu.Unlock()
		if err := b.await(ctx, l, c); err != nil {
			return res, false, err
		}
		return res, true, nil
	}
	if now.Before(b.notBefore) {
		res.Wait = b.notBefore.Sub(now)
		b.mu.Unlock()
		return res, false, nil
	}
	// Adapt the batch: a lease spent within its lifetime asks for twice as
	// much next time; one that expired unspent, for half.
	switch {
	case b.leased > 0:
		b.batch = max(1, b.batch/2)
	case !b.expires.IsZero() && b.emptiedAt.Before(b.expires):
		b.batch = min(2*b.batch, l.limit.Burst)
	}
	b.leased = 0
	n := b.batch
	c := l.newCall()
	b.refill = c
	b.mu.Unlock()
	l.do(c, func(ctx context.Context) error {
		r, err := l.gcra.AllowN(ctx, b.key, l.limit, n)
		if err == nil {
			b.mu.Lock()
			if b.refill == c { // not abandoned: its waiters get the lease
				b.lease(l, r, n)
			}
			b.mu.Unlock()
		}
		return err
	}, func(err error) {
		b.mu.Lock()
		if b.refill == c {
			b.refill = nil
		}
		b.mu.Unlock()
		if err != nil {
			l.fail(err)
		}
	})
	if err := b.await(ctx, l, c); err != nil {
		return res, false, err
	}
	return res, true, nil
}

// await waits for the lease request c: until it ends, or until its
// Timeout passes, when the request is abandoned (a late answer is
// discarded) and Redis counts as down; or until ctx ends, whose error it
// returns.
func (b *bucket) await(ctx context.Context, l *Limiter, c *redisCall) error {
	err := c.wait(ctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err
	}
	b.mu.Lock()
	if b.refill == c {
		b.refill = nil
	}
	b.mu.Unlock()
	l.fail(err)
	return nil
}

// lease takes the answer r of Redis to a request for n permits. b.mu is
// held.
func (b *bucket) lease(l *Limiter, r *redis_rate.Result, n int) {
	now := time.Now()
	if r.Allowed > 0 {
		b.leased, b.expires = r.Allowed, now.Add(l.leaseTTL)
		return
	}
	// Refused: RetryAfter is when n permits are free; one is free n-1
	// intervals sooner. The next request asks for one alone, at once if
	// it is free now.
	b.batch, b.expires = 1, time.Time{}
	if wait := r.RetryAfter - time.Duration(n-1)*l.interval; wait > 0 {
		b.notBefore = now.Add(max(wait, time.Millisecond))
	}
}

// handOver gives the caller a permit of the lease; in the grace after
// Redis came back, only if the local share has one too. b.mu is held.
func (b *bucket) handOver(l *Limiter, h *health, now time.Time) resilience.SharedRateResult {
	if now.Before(h.graceUntil) {
		if lim, interval := b.localLimiter(l); !lim.TryAcquirePermit() {
			return resilience.SharedRateResult{Wait: interval}
		}
	}
	b.leased--
	if b.leased == 0 {
		b.emptiedAt = now
	}
	return resilience.SharedRateResult{}
}

// takeLocal hands over a permit of the process's share, on the fallback.
func (b *bucket) takeLocal(l *Limiter, why error) resilience.SharedRateResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last = time.Now()
	b.leased = 0 // a lease from before the outage is not spent after it
	lim, interval := b.localLimiter(l)
	if lim.TryAcquirePermit() {
		return resilience.SharedRateResult{Fallback: why}
	}
	// The smooth limiter holds no reservations: the next permit is due
	// within one interval.
	return resilience.SharedRateResult{Wait: interval, Fallback: why}
}

// localLimiter returns the local share's limiter, rebuilt when the count
// of replicas has changed, and its interval. b.mu is held.
func (b *bucket) localLimiter(l *Limiter) (ratelimiter.RateLimiter[any], time.Duration) {
	n := l.share()
	interval := l.interval * time.Duration(n)
	if b.local == nil || b.localOf != n {
		b.local, b.localOf = ratelimiter.NewSmoothWithMaxRate[any](interval), n
	}
	return b.local, interval
}
