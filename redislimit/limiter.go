package redislimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/resilienthttp/resilience"
)

// Options configure a Limiter. Rate is required; the zero value of every
// other field is a sensible default.
type Options struct {
	// Rate is how many calls the whole fleet may start per Period, under
	// each key. Required.
	Rate int

	// Period is the time Rate is counted over. Default 1s.
	Period time.Duration

	// Replicas is how many processes share the rate, for the share each
	// paces its calls at while Redis is unreachable (Rate/Replicas per
	// Period). Default 0: the processes count themselves, each announcing
	// itself to Redis once a second; before a process has seen Redis
	// once, it counts one replica, itself. Set it when the fleet's size is
	// known, for a safe share from the first call.
	Replicas int

	// Timeout bounds each Redis call; a call that takes longer counts as
	// Redis being unreachable, and no caller waits for Redis longer than
	// this, whatever the client's own timeouts (go-redis honours a
	// context's deadline only with ContextTimeoutEnabled; without it, the
	// call runs on until the client gives up, in the background, and its
	// answer is discarded). Default 50ms.
	Timeout time.Duration

	// Prefix is put before every Redis key the Limiter writes. Default
	// "resilience:".
	Prefix string
}

// Defaults and limits of Options, and the probing of an unreachable Redis.
const (
	defaultPeriod  = time.Second
	defaultTimeout = 50 * time.Millisecond
	defaultPrefix  = "resilience:"

	heartbeatEvery = time.Second     // how often a process announces itself
	heartbeatTTL   = 3 * time.Second // a replica not heard from for this long is gone
	probeFirst     = 50 * time.Millisecond
	probeMax       = 400 * time.Millisecond // the longest wait between probes of a Redis that is down
	idleBucket     = time.Minute            // a key unused for this long is forgotten
)

// A Limiter is a rate shared through Redis by every process that uses the
// same Redis, Prefix and key. It implements resilience.SharedRate; it is
// safe for concurrent use. Close stops its background work.
//
// # Leasing and its worst case
//
// A process takes permits from Redis a lease at a time (redis_rate's
// AllowN, one round trip) and hands them to its calls without one. Redis's
// GCRA gives every permit its own slot in the rate's schedule, Period/Rate
// apart; it grants a lease when its slots fit within half a Period ahead
// (the GCRA's burst), so that the replicas over their share queue their
// leases instead of being refused and asking again. A lease holds about
// the calls the process asked for over the last lease period of
// Period/3, at least one and at most Rate/10, and the process hands its
// permits out at the pace of those calls: none before the lease's first
// slot, at most B = max(1, Rate/50) at once and then one per step, where
// the step is about the time between the process's calls and never under
// Period/Rate; permits not handed out when the lease period ends are
// dropped. While a lease request is in flight, the callers of the process
// wait for its answer rather than ask Redis themselves. So a process over
// its share makes one round trip per Rate/10 calls, and one making 50
// calls a second far under the limit, one per 17 calls.
//
// A permit is thus handed out at most B-1 intervals before its slot and
// at most Period/3 after it, so in any window of length L the upstream
// sees at most the permits whose slots fall within L + Period/3:
// Rate·L/Period + Rate/3 + B + 1. That worst case needs leases spread at
// a slow pace whose calls are all held back to their ends; a fleet whose
// processes keep their pace, over their share or under it, sends the rate
// (bench/redislimit.sh: 199 to 203 per second against a limit of 200).
//
// # When Redis is slow or down
//
// A Redis call that fails or takes longer than Timeout turns the Limiter
// to its fallback: every key is paced locally at Rate/Replicas per Period
// (failsafe-go's smooth rate limiter), and each answer carries the reason,
// so that the handler emits resilience.EventSharedRateFallback. A
// background goroutine probes Redis with jittered backoff from 50ms up to
// 400ms. Once Redis answers, calls take shared permits again but also keep
// to the local share for a grace of about 0.55s, long enough for every
// other replica to have probed Redis and come back too: a replica that
// came back first cannot take the whole rate while the others still spend
// their shares unseen by Redis. Calls are back on the shared rate alone
// within about 1.1s of Redis answering.
//
// So with Replicas right (or counted), the fleet keeps to Rate while all
// processes are on their fallback. During a switch, the leases granted
// before it are still spent (up to half a Period of the rate) beside the
// shares of the processes that switched first: the test fleet of four at
// 200/s sent about 220 in the second Redis was killed. A Redis outage never
// fails a call by itself.
type Limiter struct {
	rdb      redis.UniversalClient
	gcra     *redis_rate.Limiter
	limit    redis_rate.Limit
	opts     Options
	interval time.Duration // Period/Rate: between two permits of the shared rate
	burst    int           // permits a lease hands out at once: Rate/50
	maxLease int           // permits a lease holds at most: Rate/10
	// leasePeriod is about how long a lease lasts: Period/3.
	leasePeriod time.Duration
	grace       time.Duration
	id          string // this process's member in the replica set

	buckets  sync.Map // key -> *bucket
	health   atomic.Pointer[health]
	observed atomic.Int64 // replicas counted at the last heartbeat; 0: none yet
	keepUp   atomic.Int64 // until then (unix ns) the count may rise but not fall: Redis came back and the replicas are announcing themselves again

	slots chan struct{} // one per Redis call still running (maxInFlight)
	wake  chan struct{} // a call saw Redis fail: the prober starts probing
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// health is whether the Limiter uses Redis, as one immutable value.
type health struct {
	down       error     // Redis is unreachable: why, as callers' answers carry it; nil when up
	graceUntil time.Time // Redis came back: until then calls keep to the local share too
}

var up = &health{}

// New returns a Limiter that keeps its rate in rdb, and announces the
// process to the other replicas once before returning (bounded by
// Options.Timeout; if Redis does not answer, the Limiter starts on its
// fallback). Call Close when done with it; it does not close rdb.
func New(rdb redis.UniversalClient, opts Options) (*Limiter, error) {
	switch {
	case rdb == nil:
		return nil, errors.New("redislimit: nil Redis client")
	case opts.Rate <= 0:
		return nil, fmt.Errorf("redislimit: invalid Rate %d: must be positive", opts.Rate)
	case opts.Period < 0:
		return nil, fmt.Errorf("redislimit: invalid Period %v: must not be negative", opts.Period)
	case opts.Replicas < 0:
		return nil, fmt.Errorf("redislimit: invalid Replicas %d: must not be negative", opts.Replicas)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("redislimit: invalid Timeout %v: must not be negative", opts.Timeout)
	}
	if opts.Period == 0 {
		opts.Period = defaultPeriod
	}
	if opts.Timeout == 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.Prefix == "" {
		opts.Prefix = defaultPrefix
	}
	interval := opts.Period / time.Duration(opts.Rate)
	if interval <= 0 {
		return nil, fmt.Errorf("redislimit: invalid Rate %d: more than one permit per nanosecond over Period %v", opts.Rate, opts.Period)
	}
	l := &Limiter{
		rdb:  rdb,
		gcra: redis_rate.NewLimiter(rdb),
		// Burst, for Redis, is how far ahead the fleet's leases may be
		// granted: half a Period, and at least one lease.
		limit:       redis_rate.Limit{Rate: opts.Rate, Burst: max(1, opts.Rate/10, opts.Rate/2), Period: opts.Period},
		opts:        opts,
		interval:    interval,
		burst:       max(1, opts.Rate/50),
		maxLease:    max(1, opts.Rate/10),
		leasePeriod: opts.Period / 3,
		// Every replica still on its fallback probes within probeMax
		// (+20% jitter) and one Timeout of Redis answering.
		grace: probeMax*6/5 + opts.Timeout + 20*time.Millisecond,
		id:    newID(),
		slots: make(chan struct{}, maxInFlight),
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	l.health.Store(up)
	if err := l.heartbeat(); err != nil {
		l.fail(err)
	}
	go l.run()
	return l, nil
}

// Close stops the Limiter's background work and withdraws the process
// from the replica count (waiting at most Options.Timeout for Redis).
// Calls made after Close still get answers. Redis calls that a stalled
// Redis still holds past their Timeout (at most 16) are not waited for:
// they end when the client's own timeouts end them, or when it is closed.
func (l *Limiter) Close() error {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		if l.opts.Replicas == 0 {
			// Best effort, within the Timeout: the heartbeat's TTL forgets
			// the process anyway.
			l.start(func(ctx context.Context) error {
				return l.rdb.ZRem(ctx, l.replicasKey(), l.id).Err()
			}).wait(context.Background())
		}
	})
	return nil
}

// Take implements resilience.SharedRate: it hands over a permit of the
// rate named key, from the process's lease when it holds one, else from
// Redis; or it says when the next one is due.
func (l *Limiter) Take(ctx context.Context, key string) (resilience.SharedRateResult, error) {
	b := l.bucket(key)
	for {
		h := l.health.Load()
		if h.down != nil {
			return b.takeLocal(l, h.down), nil
		}
		res, again, err := b.takeShared(ctx, l, h)
		if !again {
			return res, err
		}
	}
}

// share is how many replicas the rate is divided among on the fallback.
func (l *Limiter) share() int64 {
	if l.opts.Replicas > 0 {
		return int64(l.opts.Replicas)
	}
	return max(1, l.observed.Load())
}

func (l *Limiter) bucket(key string) *bucket {
	if b, ok := l.buckets.Load(key); ok {
		return b.(*bucket)
	}
	b, _ := l.buckets.LoadOrStore(key, &bucket{key: l.opts.Prefix + key})
	return b.(*bucket)
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
