package redislimit

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/resilienthttp/resilience"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blackHole is the address of a listener that accepts connections and
// never answers, closed (with its connections) when the test ends.
func blackHole(t *testing.T) string {
	t.Helper()
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
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	return ln.Addr().String()
}

// readmeClient is the client of addr that docs/shared-rate-limit.md
// shows (go-redis's defaults: no ContextTimeoutEnabled, 5s to dial, 3s to read), closed when the test
// ends.
func readmeClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// stall makes the Redis at addr sleep for d (DEBUG SLEEP) and returns once
// it has stopped answering; the returned function waits until it answers
// again.
func stall(t *testing.T, addr string, d time.Duration) (wait func()) {
	t.Helper()
	sleeper := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: d + 5*time.Second, MaxRetries: -1})
	probe := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	require.NoError(t, probe.Ping(context.Background()).Err())
	done := make(chan error, 1)
	go func() { done <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", d.Seconds()).Err() }()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	}, 2*time.Second, time.Millisecond, "DEBUG SLEEP stalls Redis")
	return func() {
		require.NoError(t, <-done, "DEBUG SLEEP (redis-server needs --enable-debug-command local)")
		sleeper.Close()
		probe.Close()
	}
}

func TestNewWithinTimeoutAgainstBlackHole(t *testing.T) {
	rdb := readmeClient(t, blackHole(t))
	start := time.Now()
	l, err := New(rdb, Options{Rate: 100, Replicas: 2}) // Timeout 50ms
	took := time.Since(start)
	require.NoError(t, err)
	defer l.Close()
	t.Logf("New took %v against a listener that never answers", took)
	assert.Less(t, took, time.Second, "New waits for Redis about its Timeout of 50ms, not go-redis's 5s")

	start = time.Now()
	res, err := l.Take(context.Background(), "k")
	require.NoError(t, err)
	assert.Less(t, time.Since(start), time.Second)
	require.Error(t, res.Fallback, "the limiter started on its fallback")
	assert.ErrorIs(t, res.Fallback, context.DeadlineExceeded)
	assert.ErrorContains(t, res.Fallback, "within Timeout 50ms")
	assert.Zero(t, res.Wait, "the local share's first permit")
}

func TestCallWithinDeadlineWhileRedisStalls(t *testing.T) {
	// Its own server, as DEBUG SLEEP stalls the whole of it; Redis 7
	// refuses DEBUG unless enabled (and Redis 6 knows no such option).
	srv := startRedis(t, "--enable-debug-command", "local")
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer up.Close()
	prefix := testPrefix(t)
	l, err := New(readmeClient(t, srv.addr()), Options{Rate: 100, Replicas: 2, Prefix: prefix})
	require.NoError(t, err)
	defer l.Close()
	res, err := l.Take(context.Background(), "warm")
	require.NoError(t, err)
	require.NoError(t, res.Fallback, "Redis answers before the stall")
	ev := &events{}
	rt := handlerOn(t, l, true, ev.add)

	wait := stall(t, srv.addr(), 1500*time.Millisecond)
	defer wait()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	took := time.Since(start)
	t.Logf("a call with a 300ms deadline returned after %v with Redis stalled", took)
	require.NoError(t, err, "served by the local share within its deadline")
	resp.Body.Close()
	assert.Less(t, took, time.Second)
	assert.EqualValues(t, 1, hits.Load())
	assert.Equal(t, []resilience.EventKind{resilience.EventSharedRateFallback}, ev.got())

	// A Limiter built while Redis stalls starts on its fallback at once.
	start = time.Now()
	l2, err := New(readmeClient(t, srv.addr()), Options{Rate: 100, Replicas: 2, Prefix: prefix})
	took = time.Since(start)
	require.NoError(t, err)
	defer l2.Close()
	t.Logf("New took %v with Redis stalled", took)
	assert.Less(t, took, time.Second, "New waits for Redis about its Timeout of 50ms")
	res, err = l2.Take(context.Background(), "k")
	require.NoError(t, err)
	assert.ErrorIs(t, res.Fallback, context.DeadlineExceeded, "on its fallback")
}
