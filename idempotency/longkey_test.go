package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
)

// longInput is longer than PostgreSQL's largest btree index entry (2,704
// bytes), and random, so that compression does not shrink it: a route or
// principal this long, in an indexed column, is refused.
var longInput = func() string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	rng := rand.New(rand.NewPCG(29, 13))
	b := make([]byte, 3000)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return "r" + string(b)
}()

// A keyed POST whose route and principal are 3,000 bytes long is served,
// recorded and replayed the same on both stores (PostgreSQL refused the key
// row, `index row size … exceeds btree version 4 maximum 2704`, and the
// caller got a 503 it would retry for ever), and the key row stays small:
// what can be long is hashed.
func TestLongRouteAndPrincipal(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var logs syncBuffer
		mw, err := idempotency.New(b.store, idempotency.Options{
			Principal: func(*http.Request) (string, error) { return "tenant-" + longInput, nil },
			Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
		})
		require.NoError(t, err)
		app := &orders{b: b}
		h := mw.Handler(app)
		req := func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/orders/"+longInput, strings.NewReader("widget"))
			r.Header.Set("Idempotency-Key", "k-long")
			return r
		}
		first := serve(h, req())
		assert.Equal(t, http.StatusCreated, first.Code, first.Body.String())
		again := serve(h, req())
		assert.Equal(t, http.StatusCreated, again.Code, again.Body.String())
		assert.Equal(t, "true", again.Header().Get(idempotency.ReplayedHeader))
		assert.EqualValues(t, 1, app.runs.Load())
		assert.Equal(t, 1, b.rows(t))
		assert.Less(t, b.keyRowBytes(t), 200, "the key row's columns, but the recorded response, stay small")
		assert.NotContains(t, logs.String(), longInput)
	})
}

// A store error's log names the operation, bounded: the route is the
// caller's to choose, and a log line must not carry all of it.
func TestStoreErrorLogIsBounded(t *testing.T) {
	b := sqliteBackend(t)
	var logs syncBuffer
	mw, err := idempotency.New(brokenStore{b.store}, idempotency.Options{
		Principal: func(*http.Request) (string, error) { return "tenant-" + longInput, nil },
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodPost, "/orders/"+longInput, strings.NewReader("widget"))
	r.Header.Set("Idempotency-Key", "k-long")
	rec := serve(mw.Handler(&orders{b: b}), r)
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Contains(t, logs.String(), "claim failed")
	assert.Contains(t, logs.String(), "POST /orders/"+longInput[:64], "the operation's start is logged")
	assert.NotContains(t, logs.String(), longInput, "the whole route is not")
	assert.Less(t, logs.Len(), 1000, "one bounded line: %s", logs.String())
}

// brokenStore's claims fail, as a store that cannot be reached.
type brokenStore struct{ idempotency.Store }

func (brokenStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.Claim, error) {
	return idempotency.Claim{}, errors.New("store down")
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for a logger's
// output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// A key's hash is fixed-size, and parts that shift their boundary are
// another key.
func TestKeyHash(t *testing.T) {
	a := idempotency.Key{Principal: "a", Operation: "bc", Key: "d"}
	assert.Equal(t, a.Hash(), idempotency.Key{Principal: "a", Operation: "bc", Key: "d"}.Hash())
	assert.NotEqual(t, a.Hash(), idempotency.Key{Principal: "ab", Operation: "c", Key: "d"}.Hash())
	assert.NotEqual(t, a.Hash(), idempotency.Key{Principal: "a", Operation: "b", Key: "cd"}.Hash())
	assert.Len(t, idempotency.Key{Operation: longInput}.Hash(), 32)
}
