package resilience

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// keyRecorder is an upstream handler wrapper that records the key header
// of every request it gets.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) note(r *http.Request, header string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, r.Header.Get(header))
}

func (k *keyRecorder) all() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

func idemOptions() Options {
	return Options{Name: "idem-test", Retry: quickRetry(), Idempotency: IdempotencyOptions{Enabled: true}}
}

func TestIdempotencyPostRetriedWithOneGeneratedKey(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
		if n <= 2 {
			resetConn(t, w)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("created"))
	})
	c := newTestClient(t, idemOptions())

	var report Report
	req := newTestRequest(t, WithReport(context.Background(), &report), http.MethodPost, up.URL(), strings.NewReader(`{"amount":100}`))
	resp, err := c.Do(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "created", readBody(t, resp))

	got := keys.all()
	require.Len(t, got, 3, "the POST was retried through two resets")
	assert.Regexp(t, uuidV4, got[0])
	assert.Equal(t, []string{got[0], got[0], got[0]}, got, "every attempt carries the same key")
	assert.Equal(t, got[0], report.IdempotencyKey)
	assert.Empty(t, req.Header.Get("Idempotency-Key"), "the caller's request is not changed")
	for _, b := range up.Bodies() {
		assert.Equal(t, `{"amount":100}`, string(b))
	}
}

func TestIdempotencyKeyPerLogicalCall(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
		w.WriteHeader(http.StatusCreated)
	})
	c := newTestClient(t, idemOptions())
	for i := 0; i < 2; i++ {
		resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
		require.NoError(t, err)
		readBody(t, resp)
	}
	got := keys.all()
	require.Len(t, got, 2)
	assert.NotEqual(t, got[0], got[1], "two calls are two operations: two keys")
}

func TestIdempotencyCallerKeyKept(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "X-Request-Key")
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	opts := idemOptions()
	opts.Idempotency.Header = "x-request-key"
	c := newTestClient(t, opts)

	req := newTestRequest(t, context.Background(), http.MethodPatch, up.URL(), strings.NewReader("x"))
	req.Header.Set("X-Request-Key", "order-42")
	resp, err := c.Do(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	readBody(t, resp)
	assert.Equal(t, []string{"order-42", "order-42"}, keys.all())
}

// A caller's key under a map key that is not canonical, as hand-written
// code or a proxy may set it, is the caller's key: no second key is added
// beside it, and the call is keyed (a POST retried after a 503).
func TestIdempotencyCallerKeyNonCanonicalName(t *testing.T) {
	var mu sync.Mutex
	var seen [][]string
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		seen = append(seen, r.Header.Values("Idempotency-Key"))
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c := newTestClient(t, idemOptions())

	var report Report
	req := newTestRequest(t, WithReport(context.Background(), &report), http.MethodPost, up.URL(), strings.NewReader("x"))
	req.Header["idempotency-key"] = []string{"order-7"}
	resp, err := c.Do(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "keyed, so the POST was retried")
	readBody(t, resp)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, [][]string{{"order-7"}, {"order-7"}}, seen, "the caller's key alone, on every attempt")
	assert.Equal(t, "order-7", report.IdempotencyKey)
	assert.Equal(t, http.Header{"idempotency-key": {"order-7"}}, req.Header, "the caller's request is not changed")
}

// An empty key under a non-canonical name is no key: the made key
// replaces it, and the upstream sees one field.
func TestIdempotencyEmptyCallerKeyReplaced(t *testing.T) {
	var mu sync.Mutex
	var seen [][]string
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		seen = append(seen, r.Header.Values("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	c := newTestClient(t, idemOptions())
	req := newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x"))
	req.Header["idempotency-key"] = []string{""}
	resp, err := c.Do(req)
	require.NoError(t, err)
	readBody(t, resp)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 1)
	require.Len(t, seen[0], 1, "one key field on the wire, not the empty one beside the made one")
	assert.NotEmpty(t, seen[0][0])
}

func TestIdempotencyOffLeavesWritesAlone(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c := newTestClient(t, Options{Name: "idem-off", Retry: quickRetry()})
	resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
	require.NoError(t, err)
	readBody(t, resp)
	assert.Equal(t, []string{""}, keys.all(), "sent once, with no key")
}

func TestIdempotencyExplicitNotRetryableWins(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c := newTestClient(t, idemOptions())
	resp, err := c.Do(newTestRequest(t, WithRetryable(context.Background(), false), http.MethodPost, up.URL(), strings.NewReader("x")))
	require.NoError(t, err)
	readBody(t, resp)
	assert.Equal(t, []string{""}, keys.all())
}

func TestIdempotencySafeMethodsGetNoKey(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
	})
	c := newTestClient(t, idemOptions())
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions} {
		resp, err := c.Do(newTestRequest(t, context.Background(), m, up.URL(), nil))
		require.NoError(t, err)
		readBody(t, resp)
	}
	assert.Equal(t, []string{"", "", ""}, keys.all())
}

func TestIdempotencyConflictRetriedAfterRetryAfter(t *testing.T) {
	keys := &keyRecorder{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		keys.note(r, "Idempotency-Key")
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c := newTestClient(t, idemOptions())
	resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the 409 (key in progress) was retried")
	readBody(t, resp)
	got := keys.all()
	require.Len(t, got, 2)
	assert.Equal(t, got[0], got[1])
	retries := c.events.ofKind(EventRetry)
	require.Len(t, retries, 1)
	assert.Equal(t, http.StatusConflict, retries[0].StatusCode)
	assert.Zero(t, retries[0].Delay, "Retry-After: 0 honoured over the computed delay")
}

// Only the middleware's answer for a key in progress (a 409 with a
// Retry-After, not a replay) is retried: the application's own 409 and a
// replayed 409 are final answers, and Retry.ShouldRetry, when set, has the
// last word on every 409.
func TestIdempotencyOnlyInProgressConflictRetried(t *testing.T) {
	never := func(*http.Request, *http.Response, error) bool { return false }
	conflicts := func(_ *http.Request, resp *http.Response, _ error) bool {
		return resp != nil && resp.StatusCode == http.StatusConflict
	}
	for _, c := range []struct {
		name        string
		header      http.Header
		shouldRetry func(*http.Request, *http.Response, error) bool
		attempts    int64
	}{
		{"application 409", http.Header{}, nil, 1},
		{"replayed 409", http.Header{"Retry-After": {"0"}, "Idempotent-Replayed": {"true"}}, nil, 1},
		{"in progress", http.Header{"Retry-After": {"0"}}, nil, 2},
		{"in progress, ShouldRetry false", http.Header{"Retry-After": {"0"}}, never, 1},
		{"in progress, ShouldRetry true", http.Header{"Retry-After": {"0"}}, conflicts, 2},
		{"application 409, ShouldRetry true", http.Header{}, conflicts, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					for k, vs := range c.header {
						w.Header()[k] = vs
					}
					w.WriteHeader(http.StatusConflict)
					w.Write([]byte("conflict"))
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			opts := idemOptions()
			opts.Retry.ShouldRetry = c.shouldRetry
			cl := newTestClient(t, opts)
			resp, err := cl.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
			require.NoError(t, err)
			body := readBody(t, resp)
			assert.Equal(t, c.attempts, up.requests.Load(), "attempts")
			if c.attempts == 1 {
				assert.Equal(t, http.StatusConflict, resp.StatusCode)
				assert.Equal(t, "conflict", body, "the 409 reaches the caller as it came")
			} else {
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
			}
		})
	}
}

func TestIdempotencyConflictRetryAfterPastDeadlineAnswersNow(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusConflict)
	})
	opts := idemOptions()
	opts.TotalTimeout, opts.AttemptTimeout = time.Second, time.Second
	c := newTestClient(t, opts)
	resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
	require.NoError(t, err)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "a Retry-After past the deadline is not waited")
	readBody(t, resp)
	assert.EqualValues(t, 1, up.requests.Load())
}

func TestIdempotencyConflictNotRetriedWithoutKey(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
	})
	c := newTestClient(t, Options{Name: "idem-off", Retry: quickRetry()})
	resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
	require.NoError(t, err)
	readBody(t, resp)
	assert.EqualValues(t, 1, up.requests.Load(), "a 409 is a final answer for a call that is not keyed")
}

func TestIdempotencyUnprocessableNeverRetried(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte("key reused with a different request"))
	})
	opts := idemOptions()
	opts.Retry.ShouldRetry = func(*http.Request, *http.Response, error) bool { return true }
	c := newTestClient(t, opts)
	resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, "key reused with a different request", readBody(t, resp), "reported as it came")
	assert.EqualValues(t, 1, up.requests.Load(), "not retried, whatever ShouldRetry says")
}

func TestIdempotencyHedgingWritesOnlyWhenAsked(t *testing.T) {
	for _, hedge := range []bool{false, true} {
		t.Run(map[bool]string{false: "sent once", true: "hedged"}[hedge], func(t *testing.T) {
			keys := &keyRecorder{}
			release := make(chan struct{})
			up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				keys.note(r, "Idempotency-Key")
				if n == 1 && hedge {
					select { // the first attempt is slow: the hedge wins
					case <-r.Context().Done():
					case <-release:
					}
					return
				}
				if n == 1 {
					time.Sleep(30 * time.Millisecond) // slower than Delay: a hedge would go out
				}
				w.WriteHeader(http.StatusCreated)
			})
			defer close(release)
			opts := idemOptions()
			opts.Hedging = HedgingOptions{Enabled: true, Delay: time.Millisecond, MaxHedges: 1}
			opts.Idempotency.Hedge = hedge
			c := newTestClient(t, opts)
			resp, err := c.Do(newTestRequest(t, context.Background(), http.MethodPost, up.URL(), strings.NewReader("x")))
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			readBody(t, resp)
			got := keys.all()
			if !hedge {
				assert.Len(t, got, 1, "a keyed write is not hedged unless Hedge says so")
				return
			}
			require.Len(t, got, 2)
			assert.Regexp(t, uuidV4, got[0])
			assert.Equal(t, got[0], got[1], "the hedge carries the same key")
		})
	}
}

func TestIdempotencyOptionsValidated(t *testing.T) {
	_, err := NewHandler(Options{Idempotency: IdempotencyOptions{Enabled: true, Header: "bad header"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Idempotency.Header")

	cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"payments": {"idempotency": {"enabled": true, "header": "x-idempotency-key"}}}}`))
	require.NoError(t, err)
	o := cfg.Upstreams["payments"].Idempotency
	assert.True(t, o.Enabled)
	assert.Equal(t, "x-idempotency-key", o.Header)

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"payments": {"idempotency": {"enabled": "yes"}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "idempotency.enabled")
	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"payments": {"idempotency": {"header": 7}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "idempotency.header")
}

func TestNewIdempotencyKeyIsRandomUUIDv4(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		k := newIdempotencyKey()
		require.Regexp(t, uuidV4, k)
		require.False(t, seen[k])
		seen[k] = true
	}
}
