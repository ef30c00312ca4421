package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// fail turns the Limiter to its fallback, if it is not there already, and
// wakes the prober.
func (l *Limiter) fail(err error) {
	for {
		h := l.health.Load()
		if h.down != nil {
			return
		}
		n := l.share()
		down := &health{down: fmt.Errorf("redislimit: Redis unreachable, pacing at this process's share of the rate (%d of %d per %v, %d replicas): %w",
			l.opts.Rate/int(n), l.opts.Rate, l.opts.Period, n, err)}
		if l.health.CompareAndSwap(h, down) {
			break
		}
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run announces the process once a second while Redis is up, and probes
// Redis with backoff while it is down, until Close.
func (l *Limiter) run() {
	defer close(l.done)
	probes := &backoff.ExponentialBackOff{
		InitialInterval:     probeFirst,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         probeMax,
		Clock:               backoff.SystemClock,
	}
	probes.Reset()
	t := time.NewTimer(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.wake:
			probes.Reset()
			t.Reset(probes.NextBackOff())
			continue
		case <-t.C:
		}
		if l.health.Load().down != nil {
			// A Redis that restarted has forgotten the replicas: until
			// they have all announced themselves again, the first back
			// must not count itself alone and take the whole rate.
			l.keepUp.Store(time.Now().Add(heartbeatTTL).UnixNano())
		}
		err := l.heartbeat()
		switch h := l.health.Load(); {
		case err != nil:
			l.fail(err)
			t.Reset(probes.NextBackOff())
		case h.down != nil:
			l.health.CompareAndSwap(h, &health{graceUntil: time.Now().Add(l.grace)})
			probes.Reset()
			t.Reset(heartbeatEvery)
		default:
			l.sweep()
			t.Reset(heartbeatEvery)
		}
	}
}

// heartbeat announces the process to the other replicas and counts them
// (a sorted set of members scored by their last heartbeat); with
// Options.Replicas set, it only checks that Redis answers.
func (l *Limiter) heartbeat() error {
	return l.start(l.announce).wait(context.Background())
}

// announce is the heartbeat's Redis call.
func (l *Limiter) announce(ctx context.Context) error {
	if l.opts.Replicas > 0 {
		return l.rdb.Ping(ctx).Err()
	}
	now := time.Now()
	key := l.replicasKey()
	pipe := l.rdb.TxPipeline()
	pipe.ZAdd(ctx, key, redisZ(float64(now.UnixMilli()), l.id))
	pipe.ZRemRangeByScore(ctx, key, "-inf", fmt.Sprint(now.Add(-heartbeatTTL).UnixMilli()))
	count := pipe.ZCard(ctx, key)
	pipe.PExpire(ctx, key, heartbeatTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	n := max(1, count.Val())
	if now.UnixNano() < l.keepUp.Load() {
		n = max(n, l.observed.Load())
	}
	l.observed.Store(n)
	return nil
}

func (l *Limiter) replicasKey() string { return l.opts.Prefix + "replicas" }

// sweep forgets the keys no call has used for a while.
func (l *Limiter) sweep() {
	cutoff := time.Now().Add(-idleBucket)
	l.buckets.Range(func(k, v any) bool {
		b := v.(*bucket)
		b.mu.Lock()
		idle := b.last.Before(cutoff) && b.refill == nil
		b.mu.Unlock()
		if idle {
			l.buckets.Delete(k)
		}
		return true
	})
}

// newID names this process in the replica set.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
