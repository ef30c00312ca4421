package redislimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Four limiters on one Redis, as four processes over their share: eight
// callers each, always waiting for a permit. They share one round trip
// per lease rather than each asking Redis, and the limit still holds.
func TestWaitersShareOneRoundTripPerLease(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	const procs, callers, rate = 4, 8, 200
	var (
		hooks []*countRoundTrips
		lims  []*Limiter
	)
	for i := 0; i < procs; i++ {
		rdb := newClient(t, addr)
		hook := &countRoundTrips{}
		rdb.AddHook(hook)
		hooks = append(hooks, hook)
		lims = append(lims, newLimiter(t, rdb, Options{Rate: rate, Prefix: prefix}))
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(1500 * time.Millisecond)
	for _, l := range lims {
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					res, err := l.Take(context.Background(), "k")
					if !assert.NoError(t, err) || !assert.NoError(t, res.Fallback) {
						return
					}
					if res.Wait > 0 {
						time.Sleep(res.Wait) // the permit is due then
						continue
					}
					granted.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	var trips int64
	for _, h := range hooks {
		trips += h.n.Load()
	}
	perCall := float64(trips) / float64(granted.Load())
	t.Logf("%d lease requests for %d permits: %.3f per permit", trips, granted.Load(), perCall)
	assert.Less(t, perCall, 0.2, "one round trip per lease, shared by the waiting callers")
	assert.LessOrEqual(t, granted.Load(), int64(rate*3/2*105/100), "1.5s of the limit, +5%")
	assert.Greater(t, granted.Load(), int64(rate*3/2*80/100), "and most of it")
}

// A process calling 50 times a second far under the limit leases about a
// lease period of its own calls at a time, spread at its pace, rather
// than a fiftieth of the Period that expires unspent.
func TestLeaseFollowsTheRate(t *testing.T) {
	rdb := newClient(t, redisAddr(t))
	hook := &countRoundTrips{}
	rdb.AddHook(hook)
	l := newLimiter(t, rdb, Options{Rate: 1000})
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	const calls = 60
	for i := 0; i < calls; i++ {
		<-tick.C
		res, err := l.Take(context.Background(), "k")
		require.NoError(t, err)
		require.NoError(t, res.Fallback)
		require.Zero(t, res.Wait, "call %d: far under the limit, served at once", i)
	}
	perCall := float64(hook.n.Load()) / calls
	t.Logf("%d lease requests for %d calls: %.3f per call", hook.n.Load(), calls, perCall)
	assert.Less(t, perCall, 0.2)
}
