package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/internal/pgtest"
)

// Keyed writes far faster than one batch per interval deletes (the sweep
// deleted at most SweepBatch keys per SweepInterval: 5 per 50 ms here,
// 100 keys/s, against 500 writes as fast as they go) leave no backlog: a
// sweep that finds a full batch deletes the next at once, until none is
// left. Once every key has expired and a sweep is due, the next write's
// sweep leaves that write's key alone in the store.
func TestSweepKeepsUp(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const (
			ttl      = 50 * time.Millisecond
			interval = 50 * time.Millisecond
			writes   = 500
		)
		var (
			mu      sync.Mutex
			reports []idempotency.SweepReport
		)
		var logs syncBuffer
		mw := middleware(t, b, idempotency.Options{
			TTL: ttl, Lease: 10 * time.Millisecond, SweepInterval: interval, SweepBatch: 5,
			OnSweep: func(r idempotency.SweepReport) {
				mu.Lock()
				reports = append(reports, r)
				mu.Unlock()
			},
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		h := mw.Handler(&orders{b: b})
		for i := range writes {
			rec := serve(h, newReq("POST", "x", fmt.Sprint("k", i), "acme"))
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		}
		time.Sleep(ttl + interval) // every key has expired, and a sweep is due
		require.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", "last", "acme")).Code)
		assert.Equal(t, 1, b.keys(t), "the last write's key alone: the sweep deleted every expired key")
		assert.Equal(t, writes+1, b.rows(t))

		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, reports)
		deleted := 0
		for _, r := range reports {
			deleted += r.Deleted
		}
		assert.Equal(t, writes, deleted, "each expired key deleted once, and reported")
		last := reports[len(reports)-1]
		assert.False(t, last.Behind)
		assert.GreaterOrEqual(t, last.Lag, interval, "the oldest key had expired an interval before the last sweep")
		if b.kind == "sqlite" {
			assert.Equal(t, 1, last.Kept, "kept: the last write's key")
		} else {
			assert.GreaterOrEqual(t, last.Kept, 0, "kept: PostgreSQL's estimate")
		}
		assert.Contains(t, logs.String(), `msg="idempotency: swept" deleted=`)
	})
}

// slowSweeps is a Store whose sweeps take 100 ms a batch and always find a
// full one, as a store far behind.
type slowSweeps struct {
	idempotency.Store
	calls  atomic.Int64
	mu     sync.Mutex
	limits []int
}

func (s *slowSweeps) Sweep(ctx context.Context, limit int) (int, time.Duration, error) {
	s.calls.Add(1)
	s.mu.Lock()
	s.limits = append(s.limits, limit)
	s.mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	return limit, time.Hour, nil
}

// A sweep that runs out of its time with expired keys left says so (a
// report marked Behind, a warning), and the next write sweeps again at
// once, not a SweepInterval later. Full batches double, up to 16 times
// SweepBatch, and the next sweep starts where the last one stopped.
func TestSweepBehindSweepsAgain(t *testing.T) {
	b := sqliteBackend(t)
	store := &slowSweeps{Store: b.store}
	var (
		mu      sync.Mutex
		reports []idempotency.SweepReport
	)
	var logs syncBuffer
	mw, err := idempotency.New(store, idempotency.Options{
		Principal: byHeader,
		OnSweep: func(r idempotency.SweepReport) {
			mu.Lock()
			reports = append(reports, r)
			mu.Unlock()
		},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	h := mw.Handler(&orders{b: b})
	require.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", "k1", "acme")).Code)
	calls := store.calls.Load()
	assert.GreaterOrEqual(t, calls, int64(2), "full batches: it went on")
	assert.LessOrEqual(t, calls, int64(4), "within its time: 250 ms of 100 ms batches")
	require.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", "k2", "acme")).Code)
	assert.Greater(t, store.calls.Load(), calls, "behind: the next write swept again at once")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, reports, 2)
	assert.True(t, reports[0].Behind)
	store.mu.Lock()
	limits := slices.Clone(store.limits)
	store.mu.Unlock()
	deleted := 0
	for i, l := range limits {
		want := min(1000<<i, 16000)
		assert.Equal(t, want, l, "batch %d", i)
		if i < int(calls) {
			deleted += l
		}
	}
	assert.Equal(t, deleted, reports[0].Deleted)
	assert.Equal(t, time.Hour, reports[0].Lag)
	assert.Equal(t, -1, reports[0].Kept, "a store that is no KeyCounter (this wrapper) does not count")
	assert.Contains(t, logs.String(), "level=WARN msg=\"idempotency: sweep behind: expired keys left\"")
}

// The first sweep comes with the first write, not a SweepInterval after
// start: a server restarted over a table of expired keys deletes them at
// once.
func TestFirstSweepAtStart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const ttl = 10 * time.Millisecond
		before := middleware(t, b, idempotency.Options{TTL: ttl, Lease: ttl, SweepInterval: -1}).Handler(&orders{b: b})
		for i := range 50 {
			require.Equal(t, http.StatusCreated, serve(before, newReq("POST", "x", fmt.Sprint("k", i), "acme")).Code)
		}
		time.Sleep(2 * ttl) // every key has expired
		restarted := middleware(t, b, idempotency.Options{TTL: time.Hour}).Handler(&orders{b: b})
		require.Equal(t, http.StatusCreated, serve(restarted, newReq("POST", "x", "first", "acme")).Code)
		assert.Equal(t, 1, b.keys(t), "the first write swept the expired keys")
	})
}

// PostgreSQL has the window SQLite had (see sqlitestore's
// TestSweepBeforeTheOwnerBegins) between a claim's insert and its owner's
// row lock, but no 409 comes of it: a sweep there, once the claim's TTL
// has passed, deletes the claim; the owner's lock then finds no row of its
// token and Claim inserts the claim again before the handler runs.
func TestSweepBeforeTheOwnerLocksPostgres(t *testing.T) {
	_, dsn := pgtest.Pool(t)
	const ttl = 10 * time.Millisecond
	var mw *idempotency.Middleware
	swept := -1
	pool := tracedPool(t, dsn, &afterClaim{do: func() {
		time.Sleep(2 * ttl) // the claim's TTL has passed
		r, err := mw.Sweep(context.Background())
		assert.NoError(t, err)
		swept = r.Deleted
	}})
	b, err := pgOn(context.Background(), pool)
	require.NoError(t, err)
	mw = middleware(t, b, idempotency.Options{TTL: ttl, Lease: ttl, SweepInterval: -1})
	app := &orders{b: b}
	rec := serve(mw.Handler(app), newReq("POST", "x", "k-once", "acme"))
	require.Equal(t, 1, swept, "the sweep ran between the claim's insert and the owner's lock, and deleted the claim")
	assert.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	assert.Equal(t, 1, b.rows(t))
	assert.EqualValues(t, 1, app.runs.Load())
}
