package redislimit

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/resilienthttp/resilience"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countRoundTrips counts the lease requests rdb sends to Redis (the
// scripts of redis_rate), or with all every round trip: each command, and
// each pipeline as one.
type countRoundTrips struct {
	all bool
	n   atomic.Int64
}

func (c *countRoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countRoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.all || cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *countRoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if c.all {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

func newLimiter(t *testing.T, rdb redis.UniversalClient, opts Options) *Limiter {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t)
	}
	l, err := New(rdb, opts)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

func TestNewRejectsBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{}, "Rate 0"},
		{Options{Rate: -1}, "Rate -1"},
		{Options{Rate: 1, Period: -time.Second}, "Period -1s"},
		{Options{Rate: 1, Replicas: -2}, "Replicas -2"},
		{Options{Rate: 1, Timeout: -1}, "Timeout -1ns"},
		{Options{Rate: 2_000_000_000, Period: time.Second}, "per nanosecond"},
	} {
		_, err := New(rdb, tc.opts)
		require.Error(t, err, "%+v", tc.opts)
		assert.Contains(t, err.Error(), "redislimit: ")
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := New(nil, Options{Rate: 1})
	require.ErrorContains(t, err, "nil Redis client")
}

func TestTakeLeasesMostPermits(t *testing.T) {
	rdb := newClient(t, redisAddr(t))
	hook := &countRoundTrips{}
	rdb.AddHook(hook)
	l := newLimiter(t, rdb, Options{Rate: 100_000}) // batches of up to 2000
	const calls = 2000
	for i := 0; i < calls; i++ {
		res, err := l.Take(context.Background(), "k")
		require.NoError(t, err)
		require.Zero(t, res.Wait, "call %d: far under the rate", i)
		require.NoError(t, res.Fallback)
	}
	assert.Less(t, hook.n.Load(), int64(calls/4), "most calls are served from the lease")
}

func TestTakeOverRateSaysWhenDue(t *testing.T) {
	rdb := newClient(t, redisAddr(t))
	l := newLimiter(t, rdb, Options{Rate: 10}) // one per 100ms, burst 1
	res, err := l.Take(context.Background(), "k")
	require.NoError(t, err)
	require.Zero(t, res.Wait)
	res, err = l.Take(context.Background(), "k")
	require.NoError(t, err)
	assert.Greater(t, res.Wait, time.Duration(0), "the second permit is not free yet")
	assert.LessOrEqual(t, res.Wait, 100*time.Millisecond, "and due within one interval")
	res2, err := l.Take(context.Background(), "other")
	require.NoError(t, err)
	assert.Zero(t, res2.Wait, "keys are separate rates")
}

func TestTwoLimitersShareTheRate(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	a := newLimiter(t, newClient(t, addr), Options{Rate: 10, Prefix: prefix})
	b := newLimiter(t, newClient(t, addr), Options{Rate: 10, Prefix: prefix})
	res, err := a.Take(context.Background(), "k")
	require.NoError(t, err)
	require.Zero(t, res.Wait)
	res, err = b.Take(context.Background(), "k")
	require.NoError(t, err)
	assert.Greater(t, res.Wait, time.Duration(0), "b sees the permit a took")
}

func TestReplicasAreCounted(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	a := newLimiter(t, newClient(t, addr), Options{Rate: 100, Prefix: prefix})
	assert.EqualValues(t, 1, a.share())
	b, err := New(newClient(t, addr), Options{Rate: 100, Prefix: prefix})
	require.NoError(t, err)
	assert.EqualValues(t, 2, b.share(), "b counts a and itself")
	require.NoError(t, a.heartbeat())
	assert.EqualValues(t, 2, a.share())
	require.NoError(t, b.Close())
	require.NoError(t, a.heartbeat())
	assert.EqualValues(t, 1, a.share(), "a closed replica withdraws")

	fixed := newLimiter(t, newClient(t, addr), Options{Rate: 100, Prefix: prefix, Replicas: 5})
	assert.EqualValues(t, 5, fixed.share())
}

// handlerOn is a handler whose shared rate is l, and its transport.
func handlerOn(t *testing.T, l *Limiter, wait bool, events func(resilience.Event)) http.RoundTripper {
	t.Helper()
	h, err := resilience.NewHandler(resilience.Options{
		Name:      "vendor",
		RateLimit: resilience.RateLimitOptions{Shared: l, Wait: wait},
		Retry:     resilience.RetryOptions{Disabled: true},
		OnEvent:   events,
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func get(rt http.RoundTripper, url string) error {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func TestHandlerFailsFastOverSharedRate(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer up.Close()
	l := newLimiter(t, newClient(t, redisAddr(t)), Options{Rate: 2}) // one per 500ms
	rt := handlerOn(t, l, false, nil)

	require.NoError(t, get(rt, up.URL))
	err := get(rt, up.URL)
	require.ErrorIs(t, err, resilience.ErrRateLimited)
	var rle *resilience.RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "shared", rle.Limit)
	assert.Greater(t, rle.RetryAfter, time.Duration(0))
	assert.LessOrEqual(t, rle.RetryAfter, 500*time.Millisecond)
	assert.EqualValues(t, 1, hits.Load())
}

func TestHandlerWaitsForSharedPermit(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer up.Close()
	l := newLimiter(t, newClient(t, redisAddr(t)), Options{Rate: 50}) // one per 20ms
	rt := handlerOn(t, l, true, nil)

	start := time.Now()
	for i := 0; i < 4; i++ {
		require.NoError(t, get(rt, up.URL), "call %d waits for its permit", i)
	}
	assert.GreaterOrEqual(t, time.Since(start), 55*time.Millisecond, "three intervals of 20ms between four calls")
	assert.EqualValues(t, 4, hits.Load())
}

// events collects a handler's shared-rate events.
type events struct {
	mu    sync.Mutex
	kinds []resilience.EventKind
	errs  []error
}

func (e *events) add(ev resilience.Event) {
	if ev.Kind != resilience.EventSharedRateFallback && ev.Kind != resilience.EventSharedRateRecovered {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kinds = append(e.kinds, ev.Kind)
	e.errs = append(e.errs, ev.Err)
}

func (e *events) got() []resilience.EventKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]resilience.EventKind(nil), e.kinds...)
}

func TestFallbackWhenRedisDownAndRecovery(t *testing.T) {
	mr := miniredis.RunT(t)
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer up.Close()
	// 1000/s shared; with 100 replicas the fallback share is 10/s.
	l := newLimiter(t, newClient(t, mr.Addr()), Options{Rate: 1000, Replicas: 100})
	ev := &events{}
	rt := handlerOn(t, l, false, ev.add)
	require.NoError(t, get(rt, up.URL))
	require.NoError(t, get(rt, up.URL), "the shared rate has a burst of 20")

	mr.Close()
	// The calls spend what is left of the lease, at its pace, then one is
	// served from the local share.
	for served := 0; len(ev.got()) == 0; {
		require.Less(t, served, 101, "a lease holds at most Rate/10 permits")
		err := get(rt, up.URL)
		var rle *resilience.RateLimitError
		if errors.As(err, &rle) {
			time.Sleep(rle.RetryAfter) // the lease's next permit is due then
			continue
		}
		require.NoError(t, err, "Redis down: the call is served")
		served++
	}
	err := get(rt, up.URL)
	require.ErrorIs(t, err, resilience.ErrRateLimited, "the local share is 10/s")
	var rle *resilience.RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, 100*time.Millisecond, rle.RetryAfter, "the share's interval")
	require.Equal(t, []resilience.EventKind{resilience.EventSharedRateFallback}, ev.got())
	assert.ErrorContains(t, ev.errs[0], "Redis unreachable")
	assert.ErrorContains(t, ev.errs[0], "10 of 1000 per 1s")

	require.NoError(t, mr.Restart())
	back := time.Now()
	require.Eventually(t, func() bool {
		res, err := l.Take(context.Background(), "probe")
		return err == nil && res.Fallback == nil
	}, 2*time.Second, 5*time.Millisecond, "back on the shared rate within 2s of Redis answering")
	t.Logf("back on the shared rate %v after Redis answered", time.Since(back))
	require.Eventually(t, func() bool { return get(rt, up.URL) == nil }, 2*time.Second, 20*time.Millisecond)
	assert.Equal(t, []resilience.EventKind{resilience.EventSharedRateFallback, resilience.EventSharedRateRecovered}, ev.got())
}

func TestGraceKeepsTheShareAfterRecovery(t *testing.T) {
	mr := miniredis.RunT(t)
	l := newLimiter(t, newClient(t, mr.Addr()), Options{Rate: 1000, Replicas: 100})
	mr.Close()
	res, err := l.Take(context.Background(), "k")
	require.NoError(t, err)
	require.Error(t, res.Fallback)
	require.NoError(t, mr.Restart())
	require.Eventually(t, func() bool { return l.health.Load().down == nil }, 2*time.Second, 5*time.Millisecond)
	require.True(t, time.Now().Before(l.health.Load().graceUntil), "in the grace")

	res, err = l.Take(context.Background(), "k")
	require.NoError(t, err)
	require.NoError(t, res.Fallback)
	assert.Equal(t, 100*time.Millisecond, res.Wait, "the shared rate has permits, but the local share took one a moment ago")
}

func TestSlowRedisCountsAsDown(t *testing.T) {
	// A listener that accepts and never answers: every Redis call times out.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	conns.Add(1)
	go func() {
		defer conns.Done()
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	defer func() { ln.Close(); conns.Wait() }()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	l, err := New(rdb, Options{Rate: 100, Replicas: 2, Timeout: 20 * time.Millisecond})
	require.NoError(t, err)
	defer l.Close()

	start := time.Now()
	res, err := l.Take(context.Background(), "k")
	require.NoError(t, err)
	require.Error(t, res.Fallback, "the heartbeat in New timed out: the limiter starts on its fallback")
	assert.ErrorIs(t, res.Fallback, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), time.Second, "no call waits on a Redis that does not answer")
	assert.Zero(t, res.Wait)
}

func TestCallerCancelWhileLeaseInFlight(t *testing.T) {
	rdb := newClient(t, redisAddr(t))
	l := newLimiter(t, rdb, Options{Rate: 100})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := l.bucket("k")
	b.mu.Lock()
	b.refill = l.newCall() // another call's lease request in flight
	b.mu.Unlock()
	_, err := l.Take(ctx, "k")
	assert.True(t, errors.Is(err, context.Canceled), "a caller that leaves stops waiting for another's lease request")
	b.mu.Lock()
	close(b.refill.done)
	b.refill = nil
	b.mu.Unlock()
}
