package idempotency_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/resilienthttp/resilience/idempotency"
)

// slowHandler is longer than the middleware's store timeout (10 s), which
// bounds each commit or abort.
const slowHandler = 11 * time.Second

// A handler slower than the store timeout still has its response recorded,
// and its 5xx still releases the key: each store operation gets its own
// deadline, from when it starts, not from when the request did. One 11 s
// subtest per store, the two in parallel (with each other and with the
// package's other parallel tests); in each, the two cases run at once, on
// a database each (SQLite has one writer at a time).
func TestSlowHandler(t *testing.T) {
	t.Parallel()
	for _, nb := range []struct {
		name string
		new  func(t *testing.T) *backend
	}{{"sqlite", sqliteBackend}, {"postgres", pgBackend}} {
		t.Run(nb.name, func(t *testing.T) {
			t.Parallel()
			commits, releases := nb.new(t), nb.new(t)
			var wg sync.WaitGroup
			wg.Go(func() { slowCommits(t, commits) })
			wg.Go(func() { slow5xxReleases(t, releases) })
			wg.Wait()
		})
	}
}

// slowCommits: a slow 201 is recorded and replayed.
func slowCommits(t *testing.T, b *backend) {
	app := &orders{b: b, before: func(*http.Request) { time.Sleep(slowHandler) }}
	h := middleware(t, b, idempotency.Options{}).Handler(app)
	first := serve(h, newReq("POST", "x", "k", "acme"))
	assert.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	again := serve(h, newReq("POST", "x", "k", "acme"))
	assert.Equal(t, "true", again.Header().Get(idempotency.ReplayedHeader), "recorded: %d %s", again.Code, again.Body)
	assert.Equal(t, first.Body.String(), again.Body.String())
	assert.Equal(t, 1, b.rows(t))
	assert.EqualValues(t, 1, app.runs.Load())
}

// slow5xxReleases: a slow 503 rolls back and releases the key, so the
// retry runs at once.
func slow5xxReleases(t *testing.T, b *backend) {
	var runs atomic.Int64
	h := middleware(t, b, idempotency.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		_, err := b.insert(r.Context(), "doomed")
		assert.NoError(t, err)
		time.Sleep(slowHandler)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	assert.Equal(t, http.StatusServiceUnavailable, serve(h, newReq("POST", "x", "k", "acme")).Code)
	retry := serve(h, newReq("POST", "x", "k", "acme"))
	assert.Equal(t, http.StatusCreated, retry.Code, "the key was released: the retry runs at once (%s)", retry.Body)
	assert.Empty(t, retry.Header().Get(idempotency.ReplayedHeader))
	assert.EqualValues(t, 2, runs.Load())
	assert.Equal(t, 0, b.rows(t), "the slow run's row rolled back")
}

// failingCommits is a Store whose owners' commits fail (the database went
// away at the worst moment): the inner commit runs with a cancelled
// context, so it rolls back and reports an error.
type failingCommits struct{ idempotency.Store }

func (s failingCommits) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	if c.Txn != nil {
		c.Txn = failingCommit{c.Txn}
	}
	return c, err
}

type failingCommit struct{ idempotency.Txn }

func (t failingCommit) Commit(ctx context.Context, resp *idempotency.Response) error {
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return t.Txn.Commit(ctx, resp)
}

// A commit that fails releases the claim (an abort with its own deadline):
// the caller gets 503, and its retry runs at once instead of getting 409
// until the lease runs out. The release is safe even if the failed commit
// took effect: it deletes only a claim still held by this owner's token.
func TestFailedCommitReleasesTheKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		mw, err := idempotency.New(failingCommits{b.store}, idempotency.Options{Principal: byHeader})
		assert.NoError(t, err)
		app := &orders{b: b}
		failed := serve(mw.Handler(app), newReq("POST", "x", "k", "acme"))
		assert.Equal(t, http.StatusServiceUnavailable, failed.Code)
		assert.Contains(t, failed.Body.String(), "could not record the response")
		assert.Equal(t, "1", failed.Header().Get("Retry-After"), "released: ask again soon")

		retry := serve(middleware(t, b, idempotency.Options{}).Handler(app), newReq("POST", "x", "k", "acme"))
		assert.Equal(t, http.StatusCreated, retry.Code, "released: the retry runs (%s)", retry.Body)
		assert.Equal(t, 1, b.rows(t), "the failed commit's row rolled back")
		assert.EqualValues(t, 2, app.runs.Load())
	})
}
