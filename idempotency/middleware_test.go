package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

// spyStore counts the calls that reach the store.
type spyStore struct {
	idempotency.Store
	claims atomic.Int64
}

func (s *spyStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, req)
}

// serve sends req through the middleware over a fresh SQLite store and the
// orders app, and returns the recorded answer.
func serve(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func newReq(method, body, key, tenant string) *http.Request {
	req := httptest.NewRequest(method, "/orders", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	return req
}

// Authorization runs first: a refused caller gets 401 or 403 and the store
// is never asked, so it learns nothing about the key.
func TestPrincipalRunsBeforeTheStore(t *testing.T) {
	b := sqliteBackend(t)
	spy := &spyStore{Store: b.store}
	mw, err := idempotency.New(spy, idempotency.Options{Principal: byHeader})
	require.NoError(t, err)
	h := mw.Handler(&orders{b: b})

	assert.Equal(t, http.StatusUnauthorized, serve(h, newReq("POST", "x", "k1", "")).Code)
	assert.Equal(t, http.StatusForbidden, serve(h, newReq("POST", "x", "k1", "mallory")).Code)
	assert.EqualValues(t, 0, spy.claims.Load())
	assert.Equal(t, 0, b.rows(t))
}

// Keys are scoped by principal: another tenant's same key is another
// operation, not a replay of the first tenant's answer.
func TestKeysAreScopedByPrincipal(t *testing.T) {
	b := sqliteBackend(t)
	h := middleware(t, b, idempotency.Options{}).Handler(&orders{b: b})
	first := serve(h, newReq("POST", "x", "k1", "acme"))
	second := serve(h, newReq("POST", "x", "k1", "globex"))
	assert.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, http.StatusCreated, second.Code)
	assert.Empty(t, second.Header().Get(idempotency.ReplayedHeader))
	assert.NotEqual(t, first.Body.String(), second.Body.String())
	assert.Equal(t, 2, b.rows(t))
}

func TestBadKeysAndBodies(t *testing.T) {
	b := sqliteBackend(t)
	spy := &spyStore{Store: b.store}
	mw, err := idempotency.New(spy, idempotency.Options{Principal: byHeader, MaxKeyLength: 8, MaxBodyBytes: 4, RequireKey: true})
	require.NoError(t, err)
	h := mw.Handler(&orders{b: b})

	for name, req := range map[string]*http.Request{
		"no key":   newReq("POST", "x", "", "acme"),
		"too long": newReq("POST", "x", "123456789", "acme"),
		"control":  newReq("POST", "x", "a\x01b", "acme"),
		"space":    newReq("POST", "x", "a b", "acme"),
		"empty sf": newReq("POST", "x", `""`, "acme"),
		"two values": func() *http.Request {
			r := newReq("POST", "x", "a", "acme")
			r.Header.Add("Idempotency-Key", "b")
			return r
		}(),
	} {
		rec := serve(h, req)
		assert.Equal(t, http.StatusBadRequest, rec.Code, name)
		assert.Contains(t, rec.Body.String(), "idempotency:", name)
	}
	rec := serve(h, newReq("POST", "12345", "k", "acme"))
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	assert.Contains(t, rec.Body.String(), "limit of 4 bytes")
	chunked := newReq("POST", "12345", "k", "acme")
	chunked.ContentLength = -1
	assert.Equal(t, http.StatusRequestEntityTooLarge, serve(h, chunked).Code)
	assert.EqualValues(t, 0, spy.claims.Load())

	// A Structured Field string key is the same key as its bare form.
	assert.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", `"abc"`, "acme")).Code)
	rec = serve(h, newReq("POST", "x", "abc", "acme"))
	assert.Equal(t, "true", rec.Header().Get(idempotency.ReplayedHeader))
	assert.Equal(t, 1, b.rows(t))
}

// Options.Header's promise: a Structured Field string is a key, its
// unescaped value the key itself, spaces and escaped quotes and backslashes
// included; an invalid one is refused with 400 before the store is asked.
func TestStructuredFieldStringKeys(t *testing.T) {
	b := sqliteBackend(t)
	spy := &spyStore{Store: b.store}
	mw, err := idempotency.New(spy, idempotency.Options{Principal: byHeader})
	require.NoError(t, err)
	h := mw.Handler(&orders{b: b})
	for _, key := range []string{`"a b"`, `"a\"b"`, `"a\\b"`} {
		first := serve(h, newReq("POST", "x", key, "acme"))
		assert.Equal(t, http.StatusCreated, first.Code, "%s: %s", key, first.Body)
		again := serve(h, newReq("POST", "x", key, "acme"))
		assert.Equal(t, "true", again.Header().Get(idempotency.ReplayedHeader), key)
		assert.Equal(t, first.Body.String(), again.Body.String(), key)
	}
	assert.Equal(t, 3, b.rows(t), "three keys, three rows")
	claims := spy.claims.Load()
	for _, key := range []string{`"a\nb"`, `"a b`, `"a"b"`, "\"a\tb\""} {
		rec := serve(h, newReq("POST", "x", key, "acme"))
		assert.Equal(t, http.StatusBadRequest, rec.Code, key)
		assert.Contains(t, rec.Body.String(), "idempotency: invalid Idempotency-Key: ", key)
	}
	assert.Equal(t, claims, spy.claims.Load(), "an invalid key never reaches the store")
}

// Header names are case-insensitive: a key under a map key that is not
// canonical, as a hand-built request or a proxy may set it, is the key, and
// the same header under two spellings is the header given twice.
func TestNonCanonicalKeyHeader(t *testing.T) {
	b := sqliteBackend(t)
	h := middleware(t, b, idempotency.Options{RequireKey: true}).Handler(&orders{b: b})
	lower := func(key string) *http.Request {
		r := newReq("POST", "x", "", "acme")
		r.Header["idempotency-key"] = []string{key}
		return r
	}
	first := serve(h, lower("k1"))
	assert.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	again := serve(h, newReq("POST", "x", "k1", "acme"))
	assert.Equal(t, "true", again.Header().Get(idempotency.ReplayedHeader), "one key under either spelling")
	assert.Equal(t, "true", serve(h, lower("k1")).Header().Get(idempotency.ReplayedHeader))
	assert.Equal(t, 1, b.rows(t))

	both := lower("k2")
	both.Header.Set("Idempotency-Key", "k3")
	rec := serve(h, both)
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, rec.Body.String(), "given 2 times")
	assert.Equal(t, 1, b.rows(t))
}

// Safe methods and, without RequireKey, unkeyed writes go to the handler
// untouched.
func TestPassThrough(t *testing.T) {
	b := sqliteBackend(t)
	spy := &spyStore{Store: b.store}
	mw, err := idempotency.New(spy, idempotency.Options{Principal: byHeader})
	require.NoError(t, err)
	var runs atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	assert.Equal(t, http.StatusNoContent, serve(h, newReq("GET", "", "k", "")).Code)
	assert.Equal(t, http.StatusNoContent, serve(h, newReq("POST", "", "", "")).Code)
	assert.Equal(t, http.StatusNoContent, serve(h, newReq("POST", "", "", "")).Code)
	assert.EqualValues(t, 3, runs.Load())
	assert.EqualValues(t, 0, spy.claims.Load())
}

// A 5xx is a failure, not an outcome: the handler's writes roll back, the
// key is released, and the retry runs again. A 4xx is an outcome: recorded.
func TestServerErrorReleasesTheKey(t *testing.T) {
	b := sqliteBackend(t)
	var fail atomic.Bool
	fail.Store(true)
	app := &orders{b: b}
	h := middleware(t, b, idempotency.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			_, err := b.insert(r.Context(), "doomed")
			require.NoError(t, err)
			http.Error(w, "boom", http.StatusServiceUnavailable)
			return
		}
		app.ServeHTTP(w, r)
	}))
	assert.Equal(t, http.StatusServiceUnavailable, serve(h, newReq("POST", "x", "k", "acme")).Code)
	assert.Equal(t, 0, b.rows(t), "rolled back")
	fail.Store(false)
	rec := serve(h, newReq("POST", "x", "k", "acme"))
	assert.Equal(t, http.StatusCreated, rec.Code)
	assert.Empty(t, rec.Header().Get(idempotency.ReplayedHeader))
	assert.Equal(t, 1, b.rows(t))

	h4 := middleware(t, b, idempotency.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such product", http.StatusNotFound)
	}))
	assert.Equal(t, http.StatusNotFound, serve(h4, newReq("POST", "y", "k4", "acme")).Code)
	rec = serve(h4, newReq("POST", "y", "k4", "acme"))
	assert.Equal(t, http.StatusNotFound, rec.Code)
	assert.Equal(t, "true", rec.Header().Get(idempotency.ReplayedHeader))
}

// A panicking handler rolls back and releases the key too.
func TestPanicReleasesTheKey(t *testing.T) {
	b := sqliteBackend(t)
	h := middleware(t, b, idempotency.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := b.insert(r.Context(), "doomed")
		require.NoError(t, err)
		panic("handler bug")
	}))
	assert.Panics(t, func() { serve(h, newReq("POST", "x", "k", "acme")) })
	assert.Equal(t, 0, b.rows(t))
	app := middleware(t, b, idempotency.Options{}).Handler(&orders{b: b})
	assert.Equal(t, http.StatusCreated, serve(app, newReq("POST", "x", "k", "acme")).Code)
}

// A response too large to record is not committed: 500, nothing written.
func TestResponseOverTheLimit(t *testing.T) {
	b := sqliteBackend(t)
	h := middleware(t, b, idempotency.Options{MaxResponseBytes: 10}).Handler(&orders{b: b})
	rec := serve(h, newReq("POST", "a long item name", "k", "acme"))
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Contains(t, rec.Body.String(), "limit of 10 bytes")
	assert.Equal(t, 0, b.rows(t))
}

// The replayed headers: the handler's, less Set-Cookie, Date and the
// hop-by-hop ones; with ReplayHeaders, only those listed.
func TestReplayedHeaders(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Location", "/orders/1")
		h.Set("X-Request-Cost", "3")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		w.WriteHeader(http.StatusCreated)
	})
	for _, c := range []struct {
		allow []string
		want  http.Header
	}{
		{nil, http.Header{"Location": {"/orders/1"}, "X-Request-Cost": {"3"}}},
		{[]string{"location", "set-cookie"}, http.Header{"Location": {"/orders/1"}}},
	} {
		b := sqliteBackend(t)
		h := middleware(t, b, idempotency.Options{ReplayHeaders: c.allow}).Handler(handler)
		first := serve(h, newReq("POST", "x", "k", "acme"))
		assert.Equal(t, "session=secret", first.Header().Get("Set-Cookie"), "the first answer is the handler's own")
		rec := serve(h, newReq("POST", "x", "k", "acme"))
		got := rec.Header().Clone()
		got.Del(idempotency.ReplayedHeader)
		got.Del("Content-Length")
		assert.Equal(t, c.want, got)
	}
}

// Query and named headers are part of the digest; unnamed headers are not.
func TestDigestCoversQueryAndNamedHeaders(t *testing.T) {
	b := sqliteBackend(t)
	h := middleware(t, b, idempotency.Options{DigestHeaders: []string{"content-type"}}).Handler(&orders{b: b})
	req := func(query, ctype, other string) *http.Request {
		r := newReq("POST", "x", "k", "acme")
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", ctype)
		r.Header.Set("X-Trace", other)
		return r
	}
	assert.Equal(t, http.StatusCreated, serve(h, req("a=1&b=2", "text/plain", "1")).Code)
	assert.Equal(t, "true", serve(h, req("b=2&a=1", "text/plain", "2")).Header().Get(idempotency.ReplayedHeader), "query order and unnamed headers do not matter")
	assert.Equal(t, http.StatusUnprocessableEntity, serve(h, req("a=1&b=3", "text/plain", "1")).Code)
	assert.Equal(t, http.StatusUnprocessableEntity, serve(h, req("a=1&b=2", "application/json", "1")).Code)
	lower := req("a=1&b=2", "", "1")
	delete(lower.Header, "Content-Type")
	lower.Header["content-type"] = []string{"text/plain"}
	assert.Equal(t, "true", serve(h, lower).Header().Get(idempotency.ReplayedHeader), "a named header under a name that is not canonical is the same header")
}

// Keys past their TTL are free again, and the sweep deletes them.
func TestTTLAndSweep(t *testing.T) {
	b := sqliteBackend(t)
	mw := middleware(t, b, idempotency.Options{TTL: time.Millisecond, Lease: time.Millisecond, SweepInterval: -1})
	h := mw.Handler(&orders{b: b})
	assert.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", "k1", "acme")).Code)
	assert.Equal(t, http.StatusCreated, serve(h, newReq("POST", "x", "k2", "acme")).Code)
	time.Sleep(2 * time.Millisecond) // the TTL is measured on the clock
	rec := serve(h, newReq("POST", "x", "k1", "acme"))
	assert.Empty(t, rec.Header().Get(idempotency.ReplayedHeader), "expired: runs again")
	assert.Equal(t, 3, b.rows(t))
	time.Sleep(2 * time.Millisecond)
	r, err := mw.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, r.Deleted, "k1 claimed again expired too, and k2")
	assert.Equal(t, 0, r.Kept, "none left")
}

func TestOptionsValidation(t *testing.T) {
	b := sqliteBackend(t)
	_, err := idempotency.New(b.store, idempotency.Options{})
	assert.ErrorContains(t, err, "Options.Principal")
	_, err = idempotency.New(nil, idempotency.Options{Principal: byHeader})
	assert.ErrorContains(t, err, "nil Store")
	_, err = idempotency.New(b.store, idempotency.Options{Principal: byHeader, Lease: -time.Second})
	assert.ErrorContains(t, err, "Lease")
	_, err = idempotency.New(b.store, idempotency.Options{Principal: byHeader, Lease: time.Hour, TTL: time.Minute})
	assert.ErrorContains(t, err, "TTL")
	assert.True(t, errors.Is(idempotency.ErrClaimLost, idempotency.ErrClaimLost))
}

// An owner still running when its lease expires keeps its key: the lease
// frees the key of an owner that died (its transaction ended with it), not
// of a slow one. A retry meanwhile gets 409 (PostgreSQL), or waits for the
// owner's transaction and gets its answer replayed (SQLite, whose owner
// holds the one write lock); the handler runs once, the owner's commit
// lands, one row.
func TestLiveOwnerKeepsItsKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		inside, release := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		first.Store(true)
		app := &orders{b: b, before: func(*http.Request) {
			if first.CompareAndSwap(true, false) {
				close(inside)
				<-release
			}
		}}
		const lease = 20 * time.Millisecond
		h := middleware(t, b, idempotency.Options{Lease: lease}).Handler(app)
		owner := make(chan *httptest.ResponseRecorder, 1)
		go func() { owner <- serve(h, newReq("POST", "x", "k", "acme")) }()
		<-inside
		time.Sleep(2 * lease) // the owner, alive, outlives its lease
		retried := make(chan *httptest.ResponseRecorder, 1)
		go func() { retried <- serve(h, newReq("POST", "x", "k", "acme")) }()
		check := func(retry *httptest.ResponseRecorder) {
			if retry.Code == http.StatusConflict {
				assert.Equal(t, "1", retry.Header().Get("Retry-After"), "in progress: ask again")
				return
			}
			assert.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			assert.Equal(t, "true", retry.Header().Get(idempotency.ReplayedHeader), "waited for the owner, then replayed")
		}
		select {
		case r := <-retried: // answered at once
			check(r)
			retried = nil
		case <-time.After(lease): // waiting on the owner's transaction
		}
		close(release)
		assert.Equal(t, http.StatusCreated, (<-owner).Code, "the live owner's commit lands")
		if retried != nil {
			check(<-retried)
		}
		assert.EqualValues(t, 1, app.runs.Load(), "the handler ran once")
		assert.Equal(t, 1, b.rows(t))
		assert.Equal(t, "true", serve(h, newReq("POST", "x", "k", "acme")).Header().Get(idempotency.ReplayedHeader))
	})
}

// A write without a key (RequireKey false; a client call made with
// WithRetryable(ctx, false) sends none) reaches the handler with no
// transaction: the store's Tx is nil, and a handler that uses it without
// the check docs/idempotency.md shows panics. With the check, it writes
// unprotected through the database.
func TestKeylessWriteHasNoTx(t *testing.T) {
	b := sqliteBackend(t)
	mw := middleware(t, b, idempotency.Options{})
	unchecked := mw.Handler(&orders{b: b}) // orders.insert uses sqlitestore.Tx unchecked
	assert.Panics(t, func() { serve(unchecked, newReq("POST", "x", "", "acme")) }, "nil Tx, unchecked")

	db := b.db
	checked := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const insert = `INSERT INTO orders (item) VALUES (?)`
		var err error
		if tx := sqlitestore.Tx(r.Context()); tx != nil {
			_, err = tx.ExecContext(r.Context(), insert, "keyed")
		} else {
			_, err = db.ExecContext(r.Context(), insert, "unkeyed")
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	assert.Equal(t, http.StatusCreated, serve(checked, newReq("POST", "x", "", "acme")).Code)
	assert.Equal(t, http.StatusCreated, serve(checked, newReq("POST", "x", "k", "acme")).Code)
	assert.Equal(t, 2, b.rows(t))
}
