package redislimit

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/go-redis/redis_rate/v10"
	"github.com/resilienthttp/resilience"
)

// A bucket is one key's permits in this process: the lease from Redis,
// and the local share for the fallback.
//
// A lease is n permits that Redis's GCRA granted in one round trip, each
// with its own slot in the rate's schedule (Period/Rate apart, the first
// at start). The process hands them out by a local GCRA of its own: at
// most one per step, at most Burst at once (tokens beyond are dropped),
// none before start and none after end. step follows the process's own
// rate of calls, so that a lease lasts about one lease period: a process
// making 50 calls a second spreads a lease of 17 over a third of a second
// rather than spending it at the fleet's pace and then letting it expire.
type bucket struct {
	key string // in Redis (redis_rate puts "rate:" before it)

	mu        sync.Mutex
	left      int           // permits of the lease not handed out yet
	next      time.Time     // the local GCRA's theoretical time of the next permit
	step      time.Duration // between two permits of the lease
	ahead     time.Duration // how far ahead of the pace a permit is handed out: the burst
	end       time.Time     // the lease's permits are dropped from then
	asks      int           // calls that asked for a permit since the last lease request
	askedAt   time.Time     // when the last lease request was made
	notBefore time.Time     // Redis refused: no lease is granted before
	refill    *redisCall    // the lease request in flight; nil if none
	last      time.Time     // last call, to forget idle keys

	local   ratelimiter.RateLimiter[any] // the fallback share; kept across the switches
	localOf int64                        // the replica count local was built for
}

// takeShared hands over a permit from the lease, or says when its next
// one is due, or asks Redis for a new lease. Waiting callers share one
// round trip: while a lease request is in flight, the others wait for its
// answer instead of asking Redis themselves. again reports that Redis
// failed, or that the caller should ask once more at once.
func (b *bucket) takeShared(ctx context.Context, l *Limiter, h *health) (res resilience.SharedRateResult, again bool, err error) {
	now := time.Now()
	b.mu.Lock()
	b.last = now
	b.asks++
	if b.left > 0 && now.Before(b.end) {
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
	n, step := b.size(l, h, now)
	b.left, b.asks, b.askedAt = 0, 0, now
	c := l.newCall()
	b.refill = c
	b.mu.Unlock()
	l.do(c, func(ctx context.Context) error {
		r, err := l.gcra.AllowN(ctx, b.key, l.limit, n)
		if err == nil {
			b.mu.Lock()
			if b.refill == c { // not abandoned: its waiters get the lease
				b.lease(l, r, n, step)
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

// size is the next lease's permits and their step, from the calls that
// asked since the last lease request: about one lease period of them at
// their rate, at least one and at most maxLease, handed out no faster than
// the shared rate (and, in the grace after Redis came back, than the local
// share). A first request asks for one. b.mu is held.
func (b *bucket) size(l *Limiter, h *health, now time.Time) (int, time.Duration) {
	if b.askedAt.IsZero() {
		return 1, l.leasePeriod
	}
	since := max(now.Sub(b.askedAt), l.interval, time.Millisecond)
	perPeriod := float64(b.asks) * float64(l.leasePeriod) / float64(since)
	n := int(min(math.Ceil(perPeriod), float64(l.maxLease)))
	n = max(n, 1)
	step := max(time.Duration(float64(l.leasePeriod)/max(perPeriod, float64(n))), l.interval)
	if now.Before(h.graceUntil) {
		// The grace hands out no more than the local share: a lease paced
		// faster would hold slots of the schedule that nobody spends. And
		// small leases: one spread at the share's pace over a lease period
		// would be spent long after its slots, beside the fast leases
		// that follow the grace.
		step = max(step, l.interval*time.Duration(l.share()))
		n = max(1, min(n, l.burst, int(l.leasePeriod/step)))
	}
	return n, step
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

// lease takes the answer r of Redis to a request for n permits, handed
// out one per step. b.mu is held.
func (b *bucket) lease(l *Limiter, r *redis_rate.Result, n int, step time.Duration) {
	now := time.Now()
	if r.Allowed == 0 {
		// Refused: the queue of leases granted ahead is full; RetryAfter
		// is when n permits fit in it.
		b.notBefore = now.Add(max(r.RetryAfter, time.Millisecond))
		return
	}
	// ResetAfter is when the last of the n slots is due: the first is
	// n-1 intervals sooner, now if the fleet had not used the rate.
	start := now.Add(max(0, r.ResetAfter-time.Duration(n)*l.interval))
	b.left, b.step, b.next = r.Allowed, step, start
	b.end = start.Add(time.Duration(r.Allowed) * step)
	// The burst: B-1 steps ahead of the pace, within the lease (and
	// without overflowing a Duration for a long Period).
	b.ahead = b.end.Sub(start)
	if steps := int64(b.ahead / step); int64(l.burst-1) < steps {
		b.ahead = time.Duration(l.burst-1) * step
	}
}

// handOver gives the caller a permit of the lease, or says when the next
// is due; in the grace after Redis came back, only if the local share has
// one too. b.mu is held.
func (b *bucket) handOver(l *Limiter, h *health, now time.Time) resilience.SharedRateResult {
	if due := b.next.Add(-b.ahead); now.Before(due) {
		return resilience.SharedRateResult{Wait: due.Sub(now)}
	}
	if now.Before(h.graceUntil) {
		if lim, interval := b.localLimiter(l); !lim.TryAcquirePermit() {
			return resilience.SharedRateResult{Wait: interval}
		}
	}
	if b.next.Before(now) {
		b.next = now // a pause drops the permits it did not use beyond the burst
	}
	b.next = b.next.Add(b.step)
	b.left--
	return resilience.SharedRateResult{}
}

// takeLocal hands over a permit of the process's share, on the fallback.
func (b *bucket) takeLocal(l *Limiter, why error) resilience.SharedRateResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last = time.Now()
	b.asks++   // the first lease after the outage is sized to the calls made during it
	b.left = 0 // a lease from before the outage is not spent after it
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
