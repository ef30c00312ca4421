package idempotency_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/internal/pgtest"
)

// PostgreSQL crashes while an owner's handler runs, and comes back. The
// owner, alive, cannot commit: its transaction died with the server, and
// it answers 503; nor can it release its claim while the server is down.
// It releases it as soon as the server answers again, so the retry of the
// same key runs within seconds of the database's return, not once the
// lease (a minute here) has run out; before, it got 409 for the whole
// lease. The handler never runs twice at once, and the one row is the
// retry's.
func TestDatabaseCrashReleasesTheKey(t *testing.T) {
	c := pgtest.NewCluster(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.DSN)
	require.NoError(t, err)
	defer pool.Close()
	b, err := pgOn(ctx, pool)
	require.NoError(t, err)

	inside, proceed := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	var running, overlapped atomic.Int64
	app := &orders{b: b, before: func(*http.Request) {
		if running.Add(1) > 1 {
			overlapped.Add(1)
		}
		defer running.Add(-1)
		if first.CompareAndSwap(true, false) {
			close(inside)
			<-proceed
		}
	}}
	var logs syncBuffer
	mw, err := idempotency.New(b.store, idempotency.Options{
		Principal: byHeader,
		Lease:     time.Minute,
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(app))
	defer srv.Close()
	client := &http.Client{Transport: newBase(t)}
	send := func() (int, string) {
		resp, err := client.Do(post(t, srv.URL, "widget", "k-crash"))
		require.NoError(t, err)
		return resp.StatusCode, answer(t, resp)
	}

	owner := make(chan int, 1)
	go func() {
		code, _ := send()
		owner <- code
	}()
	<-inside // the order row is written in the owner's transaction
	c.Crash(t)
	close(proceed)
	assert.Equal(t, http.StatusServiceUnavailable, <-owner, "the commit failed with the server")
	code, body := send()
	assert.Equal(t, http.StatusServiceUnavailable, code, "the server is down: %s", body)

	c.Start(t)
	back := time.Now()
	var statuses []int
	for {
		code, body = send()
		statuses = append(statuses, code)
		if code == http.StatusCreated {
			break
		}
		require.Contains(t, []int{http.StatusConflict, http.StatusServiceUnavailable}, code, body)
		require.Less(t, time.Since(back), 15*time.Second, "the key is still claimed %v after the database came back (answers %v); logs:\n%s", time.Since(back), statuses, logs.String())
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(back)
	t.Logf("usable %v after the database came back; answers %v", took, statuses)
	assert.Less(t, took, 5*time.Second, "usable within seconds")
	assert.Contains(t, body, `"item":"widget"`)
	assert.EqualValues(t, 2, app.runs.Load(), "the owner's run, rolled back, and the retry's")
	assert.Zero(t, overlapped.Load(), "the handler never ran twice at once")

	fresh, err := pgxpool.New(ctx, c.DSN)
	require.NoError(t, err)
	defer fresh.Close()
	var rows int
	require.NoError(t, fresh.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&rows))
	assert.Equal(t, 1, rows, "the retry's row; the owner's rolled back")
	code, _ = send()
	assert.Equal(t, http.StatusCreated, code, "replayed")
}

// afterClaim is a pgx query tracer that calls do once, after the first
// claim insert into idempotency_keys that lands: the claim is recorded,
// and its owner's transaction has not begun. The claim waits for do.
type afterClaim struct {
	do   func()
	once sync.Once
}

type tracedSQL struct{}

func (a *afterClaim) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tracedSQL{}, d.SQL)
}

func (a *afterClaim) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(tracedSQL{}).(string)
	if d.Err == nil && d.CommandTag.RowsAffected() == 1 && strings.HasPrefix(strings.TrimSpace(sql), "INSERT INTO idempotency_keys") {
		a.once.Do(a.do)
	}
}

// tracedPool connects to dsn with tracer on each connection.
func tracedPool(t testing.TB, dsn string, tracer pgx.QueryTracer) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// PostgreSQL crashes after a claim's insert has landed and before its
// owner's transaction begins. The owner, alive, answers 503 without
// running the handler, and cannot release its claim while the server is
// down. It releases it as soon as the server answers again, as after a
// failed commit, so the retry of the same key runs within seconds of the
// database's return, not once the lease (a minute here) has run out;
// before, the release was tried once and the key got 409 for the whole
// lease.
func TestDatabaseCrashBeforeTheOwnerBegins(t *testing.T) {
	c := pgtest.NewCluster(t)
	ctx := context.Background()
	inserted, crashed := make(chan struct{}), make(chan struct{})
	pool := tracedPool(t, c.DSN, &afterClaim{do: func() {
		close(inserted)
		<-crashed
	}})
	b, err := pgOn(ctx, pool)
	require.NoError(t, err)
	app := &orders{b: b}
	var logs syncBuffer
	mw, err := idempotency.New(b.store, idempotency.Options{
		Principal: byHeader,
		Lease:     time.Minute,
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(app))
	defer srv.Close()
	client := &http.Client{Transport: newBase(t)}
	do := func() (int, string, error) {
		resp, err := client.Do(post(t, srv.URL, "widget", "k-crash-claim"))
		if err != nil {
			return 0, "", err
		}
		return resp.StatusCode, answer(t, resp), nil
	}

	type result struct {
		code int
		body string
		err  error
	}
	owner := make(chan result, 1)
	go func() {
		code, body, err := do()
		owner <- result{code, body, err}
	}()
	<-inserted // the claim is recorded; the owner's transaction has not begun
	c.Crash(t)
	close(crashed)
	r := <-owner
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusServiceUnavailable, r.code, "the owner's transaction could not begin: %s", r.body)
	assert.Zero(t, app.runs.Load(), "the handler did not run")

	c.Start(t)
	back := time.Now()
	var statuses []int
	for {
		code, body, err := do()
		require.NoError(t, err)
		statuses = append(statuses, code)
		if code == http.StatusCreated {
			assert.Contains(t, body, `"item":"widget"`)
			break
		}
		require.Contains(t, []int{http.StatusConflict, http.StatusServiceUnavailable}, code, body)
		require.Less(t, time.Since(back), 15*time.Second, "the key is still claimed %v after the database came back, its lease a minute (answers %v); logs:\n%s", time.Since(back), statuses, logs.String())
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("usable %v after the database came back; answers %v", time.Since(back), statuses)
	assert.Contains(t, logs.String(), "claim released once the store answered again")
	assert.EqualValues(t, 1, app.runs.Load(), "the retry's run alone")
	assert.Equal(t, 1, b.rows(t))
}

// leaseSpy records the lease of each claim.
type leaseSpy struct {
	idempotency.Store
	lease atomic.Int64
}

func (s *leaseSpy) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	s.lease.Store(int64(req.Lease))
	return s.Store.Claim(ctx, req)
}

// The default lease, which a dead owner's key waits out, is shorter than
// the client's default total timeout (resilience's TotalTimeout, 30 s), so
// a default client retrying a key whose owner died gets it within its
// call.
func TestDefaultLeaseWithinClientTimeout(t *testing.T) {
	b := sqliteBackend(t)
	spy := &leaseSpy{Store: b.store}
	mw, err := idempotency.New(spy, idempotency.Options{Principal: byHeader})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, serve(mw.Handler(&orders{b: b}), newReq("POST", "x", "k", "acme")).Code)
	assert.Less(t, time.Duration(spy.lease.Load()), 30*time.Second)
	assert.Equal(t, 10*time.Second, time.Duration(spy.lease.Load()))
}
