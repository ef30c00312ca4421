package redislimit

import (
	"context"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/resilienthttp/resilience"
)

// A bucket is one key's permits in this process: the lease from Redis,
// and the local share for the fallback.
type bucket struct {
	key string // in Redis (redis_rate puts "rate:" before it)

	mu        sync.Mutex
	leased    int           // permits in hand, valid until expires
	expires   time.Time     // when the lease's permits are dropped
	emptiedAt time.Time     // when the last lease ran out, if it did
	batch     int           // permits the next lease asks for
	notBefore time.Time     // Redis refused: no permit is due before
	refill    chan struct{} // closed when the lease request in flight ends; nil if none
	last      time.Time     // last call, to forget idle keys

	local   ratelimiter.RateLimiter[any] // the fallback share; kept across the switches
	localOf int64                        // the replica count local was built for
}

// takeShared hands over a permit from the lease, or asks Redis for a new
// lease. again reports that Redis failed, or that the caller should ask
// once more at once.
func (b *bucket) takeShared(ctx context.Context, l *Limiter, h *health, tries int) (res resilience.SharedRateResult, again bool, err error) {
	now := time.Now()
	b.mu.Lock()
	b.last = now
	if b.leased > 0 && now.Before(b.expires) {
		res = b.handOver(l, h, now)
		b.mu.Unlock()
		return res, false, nil
	}
	if ch := b.refill; ch != nil {
		b.mu.Unlock()
		select {
		case <-ch:
			return res, true, nil
		case <-ctx.Done():
			return res, false, ctx.Err()
		}
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
	ch := make(chan struct{})
	b.refill = ch
	b.mu.Unlock()

	rctx, cancel := l.redisCtx(ctx)
	r, err := l.gcra.AllowN(rctx, b.key, l.limit, n)
	cancel()

	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill = nil
	close(ch)
	if err != nil {
		l.fail(err)
		return res, true, nil
	}
	now = time.Now()
	if r.Allowed > 0 {
		b.leased, b.expires = r.Allowed, now.Add(l.leaseTTL)
		return b.handOver(l, h, now), false, nil
	}
	// Refused: RetryAfter is when n permits are free; one is free n-1
	// intervals sooner. Ask again for one alone if it is free now.
	b.batch, b.expires = 1, time.Time{}
	wait := r.RetryAfter - time.Duration(n-1)*l.interval
	if wait <= 0 && tries == 0 {
		return res, true, nil
	}
	wait = max(wait, time.Millisecond)
	b.notBefore = now.Add(wait)
	res.Wait = wait
	return res, false, nil
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
