package resilience

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is the fallback layer's clock in tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fallbackFixture is a handler with fallback on, a fake clock and the
// fallback events it emitted, in front of an upstream that answers every
// path with "body of <path>" and the headers the query asks for
// (?h=Name:Value, repeated).
type fallbackFixture struct {
	h      *Handler
	client *http.Client
	clock  *fakeClock
	srv    *httptest.Server

	mu     sync.Mutex
	events []Event
}

func newFallbackFixture(t *testing.T, f FallbackOptions) *fallbackFixture {
	t.Helper()
	fx := &fallbackFixture{clock: &fakeClock{now: time.Unix(1_000_000, 0)}}
	fx.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, hv := range r.URL.Query()["h"] {
			k, v, _ := strings.Cut(hv, ":")
			w.Header().Add(k, v)
		}
		body := "body of " + r.URL.Path
		if a := r.Header.Get("Accept"); a != "" {
			body += " as " + a
		}
		if a := r.Header.Get("Authorization"); a != "" {
			body += " for " + a
		}
		if r.URL.Query().Get("chunked") != "" {
			io.WriteString(w, body[:4])
			w.(http.Flusher).Flush() // no Content-Length: the body is chunked
			body = body[4:]
		}
		io.WriteString(w, body)
	}))
	t.Cleanup(fx.srv.Close)
	f.Enabled = true
	h, err := NewHandler(Options{
		Name:     "fb",
		Fallback: f,
		Retry:    RetryOptions{Disabled: true},
		OnEvent: func(e Event) {
			if e.Kind == EventFallback {
				fx.mu.Lock()
				fx.events = append(fx.events, e)
				fx.mu.Unlock()
			}
		},
	})
	require.NoError(t, err)
	h.fbNow = fx.clock.Now
	fx.h = h
	fx.client = &http.Client{Transport: h.Transport(nil)}
	t.Cleanup(fx.client.CloseIdleConnections)
	return fx
}

// get sends a request for path with the given header lines and returns the
// response with its body read, or the error.
func (fx *fallbackFixture) do(t *testing.T, method, path string, header ...string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(method, fx.srv.URL+path, nil)
	require.NoError(t, err)
	for _, hv := range header {
		k, v, _ := strings.Cut(hv, ":")
		req.Header.Add(k, v)
	}
	resp, err := fx.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b), nil
}

func (fx *fallbackFixture) fallbackEvents() []Event {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return append([]Event(nil), fx.events...)
}

// refused asserts that err is the circuit's error, refused for reason.
func refused(t *testing.T, err error, reason error) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrCircuitOpen, "the original error is kept")
	assert.ErrorIs(t, err, ErrFallbackRefused)
	assert.ErrorIs(t, err, reason)
	for _, other := range []error{ErrFallbackIneligible, ErrFallbackNone, ErrFallbackTooStale} {
		if other != reason {
			assert.NotErrorIs(t, err, other)
		}
	}
}

// The seed exercise (000, exercise 4): a kept GET is served, labelled and
// with its Age, while the circuit is isolated; what cannot be served is
// refused, and says why.
func TestFallbackSeedExercise(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{MaxStale: time.Minute})

	resp, body, err := fx.do(t, "GET", "/a")
	require.NoError(t, err)
	assert.Equal(t, "body of /a", body)
	assert.Empty(t, resp.Header.Get("X-Resilience-Fallback"), "a fresh answer is not labelled")

	fx.h.IsolateCircuit()
	fx.clock.Advance(30 * time.Second)

	resp, body, err = fx.do(t, "GET", "/a")
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "body of /a", body)
	assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
	assert.Equal(t, "30", resp.Header.Get("Age"))
	evs := fx.fallbackEvents()
	require.Len(t, evs, 1)
	assert.Equal(t, 200, evs[0].StatusCode)
	assert.ErrorIs(t, evs[0].Err, ErrCircuitOpen)
	assert.Equal(t, "fallback", evs[0].Kind.String())

	resp, body, err = fx.do(t, "HEAD", "/a")
	require.NoError(t, err, "HEAD is answered from the kept GET")
	assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
	assert.Empty(t, body)

	_, _, err = fx.do(t, "GET", "/never")
	refused(t, err, ErrFallbackNone)
	assert.Contains(t, err.Error(), "fallback refused: none kept")

	_, _, err = fx.do(t, "POST", "/a")
	refused(t, err, ErrFallbackIneligible)

	fx.clock.Advance(31 * time.Second) // 61s old, MaxStale 1m
	_, _, err = fx.do(t, "GET", "/a")
	refused(t, err, ErrFallbackTooStale)

	fx.h.CloseCircuit()
	_, body, err = fx.do(t, "GET", "/a")
	require.NoError(t, err)
	assert.Equal(t, "body of /a", body)
}

// The upstream's stale-if-error bounds the age instead of MaxStale, and the
// Age the response came with counts.
func TestFallbackStaleIfError(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{MaxStale: time.Hour})
	path := "/s?h=Cache-Control:max-age%3D1,%20stale-if-error%3D5&h=Age:3"
	_, _, err := fx.do(t, "GET", path)
	require.NoError(t, err)
	fx.h.IsolateCircuit()

	fx.clock.Advance(time.Second)
	resp, _, err := fx.do(t, "GET", path)
	require.NoError(t, err)
	assert.Equal(t, "4", resp.Header.Get("Age"), "kept 1s ago, 3s old then")

	fx.clock.Advance(2 * time.Second) // 6s old, stale-if-error 5
	_, _, err = fx.do(t, "GET", path)
	refused(t, err, ErrFallbackTooStale)
}

func TestFallbackCredentials(t *testing.T) {
	t.Run("not kept by default", func(t *testing.T) {
		fx := newFallbackFixture(t, FallbackOptions{})
		_, _, err := fx.do(t, "GET", "/c", "Authorization:Bearer alice")
		require.NoError(t, err)
		_, _, err = fx.do(t, "GET", "/k", "Cookie:s=alice")
		require.NoError(t, err)
		fx.h.IsolateCircuit()
		_, _, err = fx.do(t, "GET", "/c", "Authorization:Bearer alice")
		refused(t, err, ErrFallbackIneligible)
		_, _, err = fx.do(t, "GET", "/c")
		refused(t, err, ErrFallbackNone)
		_, _, err = fx.do(t, "GET", "/k")
		refused(t, err, ErrFallbackNone)
	})
	t.Run("ShareCredentialed keys by credentials", func(t *testing.T) {
		fx := newFallbackFixture(t, FallbackOptions{ShareCredentialed: true})
		_, _, err := fx.do(t, "GET", "/c", "Authorization:Bearer alice")
		require.NoError(t, err)
		fx.h.IsolateCircuit()
		_, _, err = fx.do(t, "GET", "/c", "Authorization:Bearer bob")
		refused(t, err, ErrFallbackNone)
		_, _, err = fx.do(t, "GET", "/c")
		refused(t, err, ErrFallbackNone)
		_, body, err := fx.do(t, "GET", "/c", "Authorization:Bearer alice")
		require.NoError(t, err)
		assert.Equal(t, "body of /c for Bearer alice", body)
	})
}

func TestFallbackNotKept(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{MaxEntryBytes: 20})
	paths := []string{
		"/nostore?h=Cache-Control:no-store",
		"/private?h=Cache-Control:private,%20max-age%3D60",
		"/nocache?h=Cache-Control:no-cache",
		"/revalidate?h=Cache-Control:max-age%3D60,%20must-revalidate",
		"/proxyrevalidate?h=Cache-Control:proxy-revalidate",
		"/varystar?h=Vary:*",
		"/cookie?h=Set-Cookie:s%3D1",
		"/long/long/long/path",         // "body of /long/long/long/path" is longer than 20 bytes
		"/chunked/long/path?chunked=1", // so is this one, of unknown length
	}
	for _, p := range append(paths, "/kept") {
		_, _, err := fx.do(t, "GET", p)
		require.NoError(t, err)
	}
	fx.h.IsolateCircuit()
	for _, p := range paths {
		_, _, err := fx.do(t, "GET", p)
		refused(t, err, ErrFallbackNone)
	}
	_, _, err := fx.do(t, "GET", "/kept")
	require.NoError(t, err, "a response without those is kept")
	_, _, err = fx.do(t, "GET", "/x", "Cache-Control:no-store")
	refused(t, err, ErrFallbackIneligible)
}

func TestFallbackRequestNoStoreNotKept(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	_, _, err := fx.do(t, "GET", "/r", "Cache-Control:no-store")
	require.NoError(t, err)
	fx.h.IsolateCircuit()
	_, _, err = fx.do(t, "GET", "/r")
	refused(t, err, ErrFallbackNone)
}

func TestFallbackVary(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	path := "/v?h=Vary:Accept"
	for _, a := range []string{"application/json", "text/xml"} {
		_, _, err := fx.do(t, "GET", path, "Accept:"+a)
		require.NoError(t, err)
	}
	fx.h.IsolateCircuit()
	for _, a := range []string{"application/json", "text/xml"} {
		resp, body, err := fx.do(t, "GET", path, "Accept:"+a)
		require.NoError(t, err)
		assert.Equal(t, "body of /v as "+a, body)
		assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
	}
	_, _, err := fx.do(t, "GET", path, "Accept:text/plain")
	refused(t, err, ErrFallbackNone)
}

// A response the caller does not read to EOF is not kept.
func TestFallbackNotReadToEOF(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	resp, err := fx.client.Get(fx.srv.URL + "/partial")
	require.NoError(t, err)
	_, err = io.ReadFull(resp.Body, make([]byte, 3))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	fx.h.IsolateCircuit()
	_, _, err = fx.do(t, "GET", "/partial")
	refused(t, err, ErrFallbackNone)
}

// With OnTransient, a call whose retries ran out on a transient error is
// answered too; without it, the error is returned as it was.
func TestFallbackOnTransient(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("OnTransient=", on), func(t *testing.T) {
			fx := newFallbackFixture(t, FallbackOptions{OnTransient: on})
			_, _, err := fx.do(t, "GET", "/t")
			require.NoError(t, err)
			fx.client.CloseIdleConnections()
			fx.srv.Close() // connections refused from now on
			resp, body, err := fx.do(t, "GET", "/t")
			if !on {
				require.Error(t, err)
				assert.NotErrorIs(t, err, ErrFallbackRefused, "not considered")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "body of /t", body)
			assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
		})
	}
}

// A caller that left is not answered from the store.
func TestFallbackNotForCallerThatLeft(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{OnTransient: true})
	_, _, err := fx.do(t, "GET", "/l")
	require.NoError(t, err)
	fx.h.IsolateCircuit()

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fx.srv.URL+"/l", nil)
	_, err = fx.client.Do(req)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)

	// The Cancel channel, as http.Client closes it for its Timeout with a
	// RoundTripper it does not know.
	req, _ = http.NewRequest("GET", fx.srv.URL+"/l", nil)
	gone := make(chan struct{})
	close(gone)
	//lint:ignore SA1019 the deprecated way is still honoured, and tested
	req.Cancel = gone
	resp, err := fx.client.Transport.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, errRequestCanceled)
}

// memTransport answers every request with a 200 and a body of size bytes,
// in memory.
type memTransport struct{ body []byte }

func (m memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(m.body)),
		ContentLength: int64(len(m.body)), Request: req}, nil
}

// The store stays within MaxBytes however many responses are kept, and
// keeps the most recent ones.
func TestFallbackMemoryBound(t *testing.T) {
	const maxBytes = 4 << 20
	h, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true, MaxBytes: maxBytes}})
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(memTransport{body: bytes.Repeat([]byte("x"), 100<<10)})}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 10_000 {
		resp, err := client.Get(fmt.Sprintf("http://upstream.test/item/%d", i))
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.LessOrEqual(t, h.fbStore.bytes(), int64(maxBytes))
	}
	assert.Greater(t, h.fbStore.bytes(), int64(maxBytes-200<<10), "the store fills up to its bound")
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	assert.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(2*maxBytes), "heap held after GC")

	h.IsolateCircuit()
	resp, err := client.Get("http://upstream.test/item/9999")
	require.NoError(t, err, "the most recent is kept")
	resp.Body.Close()
	_, err = client.Get("http://upstream.test/item/0")
	assert.ErrorIs(t, err, ErrFallbackNone, "the oldest is forgotten")

	// A smaller MaxBytes applies at once.
	require.NoError(t, h.Update(Options{Fallback: FallbackOptions{Enabled: true, MaxBytes: 1 << 20}}))
	assert.LessOrEqual(t, h.fbStore.bytes(), int64(1<<20))
}

func TestLRUStoreEvictsLeastRecentlyUsed(t *testing.T) {
	const o = lruEntryOverhead
	ctx := context.Background()
	s := newLRUStore(3*(11+o) - 3)
	e := func(b string) *FallbackEntry { return &FallbackEntry{Body: append(make([]byte, 0, len(b)), b...)} }
	s.Put(ctx, "a", e("0123456789")) // 11 bytes with its key, and the overhead
	s.Put(ctx, "b", e("0123456789"))
	_, ok := s.Get(ctx, "a") // a is now the most recent
	require.True(t, ok)
	s.Put(ctx, "c", e("0123456789")) // three do not fit: b goes
	_, ok = s.Get(ctx, "b")
	assert.False(t, ok)
	_, ok = s.Get(ctx, "a")
	assert.True(t, ok)
	assert.Equal(t, int64(2*(11+o)), s.bytes())
	s.Put(ctx, "a", e("0")) // replaced, not added
	assert.Equal(t, int64(11+o+2+o), s.bytes())
	s.Put(ctx, "huge", e(strings.Repeat("x", 3*(11+o))))
	_, ok = s.Get(ctx, "huge")
	assert.False(t, ok, "larger than the store: not kept")
}

// Size counts what the entry holds: its body's capacity, and a header's
// text with what holds it.
func TestFallbackEntrySize(t *testing.T) {
	e := &FallbackEntry{Body: make([]byte, 3, 100), Header: http.Header{"Ab": {"x", "yz"}}, Vary: []string{"Accept"}}
	assert.Equal(t, int64(100+2+headerFieldOverhead+1+2+2*headerValueOverhead+6), e.Size())
}

// A user's store is used instead of the built-in one.
type mapStore struct {
	mu sync.Mutex
	m  map[string]*FallbackEntry
}

func (s *mapStore) Get(_ context.Context, k string) (*FallbackEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[k]
	return e, ok
}

func (s *mapStore) Put(_ context.Context, k string, e *FallbackEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = e
}

func TestFallbackCustomStore(t *testing.T) {
	st := &mapStore{m: map[string]*FallbackEntry{}}
	fx := newFallbackFixture(t, FallbackOptions{Store: st, Header: "x-from-cache"})
	_, _, err := fx.do(t, "GET", "/u")
	require.NoError(t, err)
	assert.Len(t, st.m, 1)
	assert.Zero(t, fx.h.fbStore.bytes())
	fx.h.IsolateCircuit()
	resp, _, err := fx.do(t, "GET", "/u")
	require.NoError(t, err)
	assert.Equal(t, "stale", resp.Header.Get("X-From-Cache"))
}

func TestFallbackOptionErrors(t *testing.T) {
	for field, f := range map[string]FallbackOptions{
		"Fallback.MaxStale":      {MaxStale: -1},
		"Fallback.MaxEntryBytes": {MaxEntryBytes: 2 << 20, MaxBytes: 1 << 20},
		"Fallback.MaxBytes":      {MaxBytes: -1},
		"Fallback.Header":        {Header: "bad header"},
	} {
		_, err := NewHandler(Options{Fallback: f})
		require.Error(t, err, field)
		assert.Contains(t, err.Error(), "invalid option "+field)
	}
}

func TestLoadConfigFallback(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"fallback": {"enabled": true, "maxStale": "2m",
		"maxEntryBytes": 1024, "maxBytes": 4096, "header": "X-Stale", "onTransient": true, "shareCredentialed": true}}}}`))
	require.NoError(t, err)
	assert.Equal(t, FallbackOptions{Enabled: true, MaxStale: 2 * time.Minute, MaxEntryBytes: 1024, MaxBytes: 4096,
		Header: "X-Stale", OnTransient: true, ShareCredentialed: true}, cfg.Upstreams["a"].Fallback)
	cfg, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"fallback": {"maxStale": "0s"}}}}`))
	require.NoError(t, err, "a written 0 is the default, as in Options")
	assert.Zero(t, cfg.Upstreams["a"].Fallback.MaxStale)
	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"fallback": {"maxStale": "-1s"}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fallback.maxStale")
	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"fallback": {"header": 3}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fallback.header")
}

// With OnTransient, a call cut short by the total timeout is answered too.
func TestFallbackOnTotalTimeout(t *testing.T) {
	var u *testUpstream
	u = newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 1 {
			u.hang(r)
			return
		}
		io.WriteString(w, "fresh")
	})
	h, err := NewHandler(Options{
		TotalTimeout:   50 * time.Millisecond,
		AttemptTimeout: -1,
		Fallback:       FallbackOptions{Enabled: true, OnTransient: true},
	})
	require.NoError(t, err)
	c := &http.Client{Transport: h.Transport(nil)}
	t.Cleanup(c.CloseIdleConnections)
	for i, want := range []string{"", "stale"} {
		resp, err := c.Get(u.URL())
		require.NoError(t, err, "call %d", i+1)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "fresh", string(b))
		assert.Equal(t, want, resp.Header.Get("X-Resilience-Fallback"))
	}
}

// Nothing is kept while the layer is off; Update turns it on.
func TestFallbackEnabledByUpdate(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	require.NoError(t, fx.h.Update(Options{Retry: RetryOptions{Disabled: true}}))
	_, _, err := fx.do(t, "GET", "/off")
	require.NoError(t, err)
	require.NoError(t, fx.h.Update(Options{Retry: RetryOptions{Disabled: true}, Fallback: FallbackOptions{Enabled: true}}))
	_, _, err = fx.do(t, "GET", "/on")
	require.NoError(t, err)
	fx.h.IsolateCircuit()
	_, _, err = fx.do(t, "GET", "/off")
	refused(t, err, ErrFallbackNone)
	_, _, err = fx.do(t, "GET", "/on")
	require.NoError(t, err)
}

// With OnTransient, a call whose retries ran out on a 500, 502, 503 or 504
// (RFC 5861's errors) is answered from the kept response; with nothing kept,
// or without OnTransient, the upstream's answer reaches the caller untouched.
func TestFallbackOnTransientStatus(t *testing.T) {
	var failing atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "fresh "+r.URL.Path)
	}))
	defer srv.Close()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("OnTransient=", on), func(t *testing.T) {
			failing.Store(false)
			var served atomic.Int64
			h, err := NewHandler(Options{
				Fallback: FallbackOptions{Enabled: true, OnTransient: on},
				Retry:    RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true},
				OnEvent: func(e Event) {
					if e.Kind == EventFallback {
						served.Add(1)
					}
				},
			})
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()
			get := func(path string) (*http.Response, string) {
				resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, srv.URL+path, nil))
				require.NoError(t, err)
				return resp, readBody(t, resp)
			}
			get("/kept")
			failing.Store(true)

			resp, body := get("/kept")
			if on {
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, "fresh /kept", body)
				assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
				assert.EqualValues(t, 1, served.Load())
			} else {
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
				assert.Empty(t, resp.Header.Get("X-Resilience-Fallback"))
			}
			resp, body = get("/never-kept")
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "nothing kept: the upstream's answer, untouched")
			assert.Equal(t, "busy\n", body)
		})
	}
}

// A call refused by the retry budget after its wait answers with the
// response it kept in memory; with OnTransient and a kept fallback, that
// answer gives way to the fallback without a second drain going wrong.
func TestFallbackAfterBudgetRefusedTheWaitedRetry(t *testing.T) {
	var failing atomic.Bool
	var aHits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !failing.Load() {
			io.WriteString(w, "fresh "+r.URL.Path)
			return
		}
		if r.URL.Path == "/a" {
			aHits.Add(1)
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	h, err := NewHandler(Options{
		Fallback:       FallbackOptions{Enabled: true, OnTransient: true},
		Retry:          quickRetry(),
		RetryBudget:    RetryBudgetOptions{MaxTokens: 1},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	get := func(path string) (*http.Response, error) {
		return tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, srv.URL+path, nil))
	}
	resp, err := get("/a")
	require.NoError(t, err)
	readBody(t, resp) // kept
	failing.Store(true)

	type answer struct {
		resp *http.Response
		err  error
	}
	a := make(chan answer, 1)
	go func() {
		resp, err := get("/a")
		a <- answer{resp, err}
	}()
	require.Eventually(t, func() bool { return aHits.Load() == 1 }, 5*time.Second, time.Millisecond)
	resp, err = get("/b") // spends the only token while /a waits out its Retry-After
	require.NoError(t, err)
	readBody(t, resp)

	got := <-a
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.resp.StatusCode)
	assert.Equal(t, "stale", got.resp.Header.Get("X-Resilience-Fallback"))
	assert.Equal(t, "fresh /a", readBody(t, got.resp))
}

// doHeader sends a request for path with exactly the header given, its
// names as written (not canonicalized), and returns the response with its
// body read, or the error.
func (fx *fallbackFixture) doHeader(t *testing.T, path string, h http.Header) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fx.srv.URL+path, nil)
	require.NoError(t, err)
	req.Header = h
	resp, err := fx.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b), nil
}

// Credentials under a header name that is not canonical reach the wire,
// and count as credentials.
func TestFallbackNonCanonicalCredentials(t *testing.T) {
	for _, name := range []string{"authorization", "AUTHORIZATION", "cookie", "COOKIE"} {
		t.Run(name, func(t *testing.T) {
			fx := newFallbackFixture(t, FallbackOptions{})
			_, _, err := fx.doHeader(t, "/c", http.Header{name: {"alice"}})
			require.NoError(t, err)
			fx.h.IsolateCircuit()
			_, _, err = fx.doHeader(t, "/c", http.Header{name: {"alice"}})
			refused(t, err, ErrFallbackIneligible)
			_, body, err := fx.do(t, "GET", "/c")
			refused(t, err, ErrFallbackNone)
			assert.Empty(t, body)
		})
	}
	t.Run("ShareCredentialed", func(t *testing.T) {
		fx := newFallbackFixture(t, FallbackOptions{ShareCredentialed: true})
		_, _, err := fx.doHeader(t, "/c", http.Header{"authorization": {"Bearer alice"}})
		require.NoError(t, err)
		fx.h.IsolateCircuit()
		_, _, err = fx.do(t, "GET", "/c")
		refused(t, err, ErrFallbackNone)
		_, _, err = fx.do(t, "GET", "/c", "Authorization:Bearer bob")
		refused(t, err, ErrFallbackNone)
		_, body, err := fx.do(t, "GET", "/c", "Authorization:Bearer alice")
		require.NoError(t, err, "the same credentials, whatever the spelling of their name")
		assert.Equal(t, "body of /c for Bearer alice", body)
	})
}

// A request header named by the response's Vary counts whatever the case
// of its name.
func TestFallbackVaryNonCanonical(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	path := "/v?h=Vary:X-Tenant"
	_, _, err := fx.doHeader(t, path, http.Header{"x-tenant": {"a"}})
	require.NoError(t, err)
	fx.h.IsolateCircuit()
	_, _, err = fx.do(t, "GET", path)
	refused(t, err, ErrFallbackNone)
	_, _, err = fx.do(t, "GET", path, "X-Tenant:b")
	refused(t, err, ErrFallbackNone)
	_, _, err = fx.do(t, "GET", path, "X-Tenant:a")
	require.NoError(t, err)
	_, _, err = fx.doHeader(t, path, http.Header{"X-TENANT": {"a"}})
	require.NoError(t, err)
}

// headerTransport answers every request with a 200, the header given (its
// names as written) and a short body, as a RoundTripper other than
// net/http's may.
type headerTransport struct{ h http.Header }

func (t headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	const body = "kept?"
	return &http.Response{StatusCode: 200, Header: t.h.Clone(), Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: req}, nil
}

// A response's header names are compared case-insensitively too, and so
// are a request's Cache-Control.
func TestFallbackNonCanonicalResponseHeaders(t *testing.T) {
	for name, h := range map[string]http.Header{
		"cache-control no-store":           {"cache-control": {"no-store"}},
		"CACHE-CONTROL private":            {"CACHE-CONTROL": {"private"}},
		"set-cookie":                       {"set-cookie": {"s=1"}},
		"vary *":                           {"vary": {"*"}},
		"canonical no-store after another": {"Cache-Control": {"max-age=60"}, "cache-control": {"no-store"}},
	} {
		t.Run(name, func(t *testing.T) {
			h2, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true}, Retry: RetryOptions{Disabled: true}})
			require.NoError(t, err)
			c := &http.Client{Transport: h2.Transport(headerTransport{h})}
			resp, err := c.Get("http://upstream.test/r")
			require.NoError(t, err)
			readBody(t, resp)
			h2.IsolateCircuit()
			_, err = c.Get("http://upstream.test/r")
			refused(t, err, ErrFallbackNone)
		})
	}
	t.Run("vary on a request header", func(t *testing.T) {
		h2, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true}, Retry: RetryOptions{Disabled: true}})
		require.NoError(t, err)
		c := &http.Client{Transport: h2.Transport(headerTransport{http.Header{"vary": {"x-tenant"}}})}
		req, _ := http.NewRequest("GET", "http://upstream.test/r", nil)
		req.Header["x-tenant"] = []string{"a"}
		resp, err := c.Do(req)
		require.NoError(t, err)
		readBody(t, resp)
		h2.IsolateCircuit()
		_, err = c.Get("http://upstream.test/r")
		refused(t, err, ErrFallbackNone)
	})
	t.Run("request cache-control", func(t *testing.T) {
		h2, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true}, Retry: RetryOptions{Disabled: true}})
		require.NoError(t, err)
		c := &http.Client{Transport: h2.Transport(headerTransport{http.Header{}})}
		req, _ := http.NewRequest("GET", "http://upstream.test/r", nil)
		req.Header["cache-control"] = []string{"no-store"}
		resp, err := c.Do(req)
		require.NoError(t, err)
		readBody(t, resp)
		h2.IsolateCircuit()
		_, err = c.Get("http://upstream.test/r")
		refused(t, err, ErrFallbackNone)
	})
}

// A store may hold a header whose names are not canonical: its Age counts,
// and the label and the Age served replace it rather than sit beside it.
func TestFallbackStoredNonCanonicalHeader(t *testing.T) {
	st := &mapStore{m: map[string]*FallbackEntry{}}
	fx := newFallbackFixture(t, FallbackOptions{Store: st, MaxStale: time.Minute})
	_, _, err := fx.do(t, "GET", "/n")
	require.NoError(t, err)
	require.Len(t, st.m, 1)
	for k, e := range st.m {
		st.m[k] = &FallbackEntry{StatusCode: 200, Body: e.Body, Stored: e.Stored,
			Header: http.Header{"age": {"10"}, "x-resilience-fallback": {"fresh"}}}
	}
	fx.h.IsolateCircuit()
	resp, _, err := fx.do(t, "GET", "/n")
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Age": {"10"}, "X-Resilience-Fallback": {"stale"}}, resp.Header)
	fx.clock.Advance(51 * time.Second)
	_, _, err = fx.do(t, "GET", "/n")
	refused(t, err, ErrFallbackTooStale)
}

// keys returns the keys the store holds.
func (s *mapStore) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ks []string
	for k := range s.m {
		ks = append(ks, k)
	}
	return ks
}

// The key is the target the request is sent to: the Host it names counts,
// not the URL alone.
func TestFallbackKeyedByHost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "for "+r.Host)
	}))
	defer srv.Close()
	h, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true}, Retry: RetryOptions{Disabled: true}})
	require.NoError(t, err)
	c := &http.Client{Transport: h.Transport(nil)}
	defer c.CloseIdleConnections()
	get := func(host string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/me?q=1", nil)
		require.NoError(t, err)
		req.Host = host
		return c.Do(req)
	}
	resp, err := get("tenant-a.example")
	require.NoError(t, err)
	assert.Equal(t, "for tenant-a.example", readBody(t, resp))
	resp, err = get("")
	require.NoError(t, err)
	assert.Equal(t, "for "+srv.Listener.Addr().String(), readBody(t, resp))

	h.IsolateCircuit()
	_, err = get("tenant-b.example")
	refused(t, err, ErrFallbackNone)
	for _, host := range []string{"tenant-a.example", "TENANT-A.example"} {
		resp, err = get(host)
		require.NoError(t, err, host)
		assert.Equal(t, "for tenant-a.example", readBody(t, resp))
	}
	resp, err = get(srv.Listener.Addr().String()) // the URL's own host, named as the Host
	require.NoError(t, err)
	assert.Equal(t, "for "+srv.Listener.Addr().String(), readBody(t, resp))
	resp, err = get("")
	require.NoError(t, err)
	assert.Equal(t, "for "+srv.Listener.Addr().String(), readBody(t, resp))
}

// The userinfo of a URL is a credential: it never enters a key, a log line,
// an event or an error, and a response to a request that carries it is
// kept only with ShareCredentialed, under a hash, for the same userinfo.
func TestFallbackURLUserinfo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, _ := r.BasicAuth()
		io.WriteString(w, "for "+u+" "+p)
	}))
	defer srv.Close()
	secretURL := strings.Replace(srv.URL, "://", "://erin:s3cr3t-pw@", 1) + "/me"
	for _, share := range []bool{false, true} {
		for _, direct := range []bool{false, true} { // RoundTrip itself, or through http.Client, which sends the userinfo as Authorization
			t.Run(fmt.Sprintf("ShareCredentialed=%v/direct=%v", share, direct), func(t *testing.T) {
				st := &mapStore{m: map[string]*FallbackEntry{}}
				logger, lines := evLogLines(t)
				var mu sync.Mutex
				var events []Event
				h, err := NewHandler(Options{
					Name:     "fb",
					Fallback: FallbackOptions{Enabled: true, Store: st, ShareCredentialed: share},
					Retry:    RetryOptions{Disabled: true},
					Logger:   logger,
					OnEvent: func(e Event) {
						mu.Lock()
						events = append(events, e)
						mu.Unlock()
					},
				})
				require.NoError(t, err)
				tr := h.Transport(&http.Transport{})
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr}
				get := func(raw string) (*http.Response, error) {
					req, err := http.NewRequest(http.MethodGet, raw, nil)
					require.NoError(t, err)
					if direct {
						return tr.RoundTrip(req)
					}
					return c.Do(req)
				}
				resp, err := get(secretURL)
				require.NoError(t, err)
				first := readBody(t, resp)
				for _, k := range st.keys() {
					assert.NotContains(t, k, "s3cr3t")
					assert.NotContains(t, k, "erin")
				}
				if !share {
					assert.Empty(t, st.keys(), "a credentialed response is not kept")
				} else {
					assert.Len(t, st.keys(), 1)
				}

				h.IsolateCircuit()
				_, err = get(srv.URL + "/me")
				refused(t, err, ErrFallbackNone)
				_, err = get(strings.Replace(secretURL, "s3cr3t-pw", "other", 1))
				if !share {
					refused(t, err, ErrFallbackIneligible)
				} else {
					refused(t, err, ErrFallbackNone)
				}
				resp, err = get(secretURL)
				if !share {
					refused(t, err, ErrFallbackIneligible)
					assert.NotContains(t, err.Error(), "s3cr3t")
				} else {
					require.NoError(t, err)
					assert.Equal(t, first, readBody(t, resp), "served to the same userinfo")
				}
				mu.Lock()
				defer mu.Unlock()
				require.NotEmpty(t, events)
				for _, e := range events {
					assert.NotContains(t, e.URL(), "s3cr3t")
					assert.NotContains(t, e.URL(), "erin")
					if e.Err != nil {
						assert.NotContains(t, e.Err.Error(), "s3cr3t")
					}
				}
				for _, l := range lines() {
					assert.NotContains(t, l, "s3cr3t")
				}
			})
		}
	}
}

// A label may not overwrite a header the response's framing, its caching
// or the connection depends on, in Go options or in JSON, whatever the
// case of its name.
func TestFallbackLabelReservedNames(t *testing.T) {
	for _, name := range []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "proxy-anything", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade", "Content-Length", "content-length", "Content-Encoding", "Content-Range",
		"Content-Type", "Content-Location", "Age", "age", "Cache-Control", "Expires", "Date", "ETag", "Last-Modified",
		"Vary", "Warning", "Pragma", "Set-Cookie",
	} {
		_, err := NewHandler(Options{Name: "fb", Fallback: FallbackOptions{Enabled: true, Header: name}})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), `resilience: handler "fb": invalid option Fallback.Header (`+name+`)`)
		assert.Contains(t, err.Error(), "hop-by-hop, framing or caching")

		_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"fallback": {"enabled": true, "header": "` + name + `"}}}}`))
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "resilience: config: upstreams.a.fallback.header ("+name+")")
	}
	for _, name := range []string{"X-Resilience-Fallback", "X-Cache", "Warning-Label", "X-Content-Length", "Contents"} {
		_, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true, Header: name}})
		assert.NoError(t, err, name)
	}
}

// Age is read as RFC 9111 says: its first member (section 5.1), a value
// that is not one ignored, one too large for us as 2^31 (section 1.2.2);
// and the Age served is never more than 2^31.
func TestFallbackHostileAge(t *testing.T) {
	const resident = 10 // seconds between keeping and serving
	for _, tc := range []struct {
		age  string // the Age fields the upstream sends, separated by "&"
		want string // the Age served, or "" for too stale (MaxStale 1m)
	}{
		{"30", "40"},
		{"50", "60"},
		{"51", ""},
		{"99999999999999999999", ""},
		{"9223372036854775808", ""},
		{"9223372036854775807", ""},
		{"2147483648", ""},
		{"100, 5", ""},
		{"5, 100", "15"},
		{"100&5", ""}, // two field lines: the first member is the first line's
		{"5&100", "15"},
		{"-5", "10"},
		{"+5", "10"},
		{"5.0", "10"},
		{"0x10", "10"},
		{"1e3", "10"},
		{"abc", "10"},
		{"abc, 5", "10"}, // the first member is invalid: the field is ignored
		{"", "10"},
	} {
		t.Run(tc.age, func(t *testing.T) {
			fx := newFallbackFixture(t, FallbackOptions{MaxStale: time.Minute})
			path := "/age"
			if tc.age != "" {
				path += "?h=Age:" + strings.ReplaceAll(url.QueryEscape(tc.age), "%26", "&h=Age:")
			}
			_, _, err := fx.do(t, "GET", path)
			require.NoError(t, err)
			fx.h.IsolateCircuit()
			fx.clock.Advance(resident * time.Second)
			resp, _, err := fx.do(t, "GET", path)
			if tc.want == "" {
				refused(t, err, ErrFallbackTooStale)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []string{tc.want}, resp.Header.Values("Age"))
		})
	}
	t.Run("served Age at most 2^31", func(t *testing.T) {
		fx := newFallbackFixture(t, FallbackOptions{MaxStale: 100 * 365 * 24 * time.Hour})
		path := "/age?h=Age:99999999999999999999"
		_, _, err := fx.do(t, "GET", path)
		require.NoError(t, err)
		fx.h.IsolateCircuit()
		fx.clock.Advance(resident * time.Second)
		resp, _, err := fx.do(t, "GET", path)
		require.NoError(t, err)
		assert.Equal(t, "2147483648", resp.Header.Get("Age"))
	})
}

// The served response's stale-if-error is read from its Cache-Control as
// the RFC parses it.
func TestFallbackStaleIfErrorValues(t *testing.T) {
	for _, tc := range []struct {
		cc     string
		served bool // 10 s after it was kept, MaxStale 1h
	}{
		{`stale-if-error=5`, false},
		{`stale-if-error=10`, true},
		{`stale-if-error="5"`, false},
		{`STALE-IF-ERROR=5`, false},
		{`stale-if-error=99999999999999999999`, true},
		{`stale-if-error=-1`, true}, // invalid: MaxStale bounds it
		{`stale-if-error=abc`, true},
		{`ext="x, stale-if-error=5"`, true},
		{`stale-if-error=5, stale-if-error=100`, false},
		{`stale-if-error=100, stale-if-error=5`, true},
	} {
		t.Run(tc.cc, func(t *testing.T) {
			fx := newFallbackFixture(t, FallbackOptions{MaxStale: time.Hour})
			path := "/sie?h=Cache-Control:" + url.QueryEscape(tc.cc)
			_, _, err := fx.do(t, "GET", path)
			require.NoError(t, err)
			fx.h.IsolateCircuit()
			fx.clock.Advance(10 * time.Second)
			_, _, err = fx.do(t, "GET", path)
			if tc.served {
				require.NoError(t, err)
			} else {
				refused(t, err, ErrFallbackTooStale)
			}
		})
	}
}

// A directive inside a quoted argument is no directive: the response is
// kept; a qualified no-cache or private is one, and it is not.
func TestFallbackQuotedCacheControl(t *testing.T) {
	fx := newFallbackFixture(t, FallbackOptions{})
	kept := []string{`max-age=60, community="a, private, b"`, `ext="no-store, no-cache"`}
	notKept := []string{`no-cache="a, b"`, `private="Set-Cookie"`, `max-age=60, ext="a, b", no-store`}
	for _, cc := range append(kept, notKept...) {
		_, _, err := fx.do(t, "GET", "/q?h=Cache-Control:"+url.QueryEscape(cc))
		require.NoError(t, err)
	}
	fx.h.IsolateCircuit()
	for _, cc := range kept {
		_, _, err := fx.do(t, "GET", "/q?h=Cache-Control:"+url.QueryEscape(cc))
		assert.NoError(t, err, cc)
	}
	for _, cc := range notKept {
		_, _, err := fx.do(t, "GET", "/q?h=Cache-Control:"+url.QueryEscape(cc))
		refused(t, err, ErrFallbackNone)
	}
}

// An empty 200 is a response like any other: it is kept, replaces the one
// kept before, and is served.
func TestFallbackKeepsEmpty(t *testing.T) {
	var empty atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if empty.Load() {
			if r.URL.Query().Get("chunked") != "" {
				w.(http.Flusher).Flush() // no Content-Length: chunked, and empty
			}
			return // Content-Length: 0
		}
		io.WriteString(w, "older")
	}))
	defer srv.Close()
	for _, path := range []string{"/e", "/e?chunked=1"} {
		t.Run(path, func(t *testing.T) {
			h, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true}, Retry: RetryOptions{Disabled: true}})
			require.NoError(t, err)
			c := &http.Client{Transport: h.Transport(nil)}
			defer c.CloseIdleConnections()
			empty.Store(false)
			resp, err := c.Get(srv.URL + path)
			require.NoError(t, err)
			assert.Equal(t, "older", readBody(t, resp))
			empty.Store(true)
			resp, err = c.Get(srv.URL + path)
			require.NoError(t, err)
			assert.Empty(t, readBody(t, resp))
			resp, err = c.Get(srv.URL + path + "&new=1")
			require.NoError(t, err)
			assert.Empty(t, readBody(t, resp))

			h.IsolateCircuit()
			for _, p := range []string{path, path + "&new=1"} {
				resp, err = c.Get(srv.URL + p)
				require.NoError(t, err, p)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
				assert.Empty(t, readBody(t, resp), "the empty one replaced the older")
				assert.Zero(t, resp.ContentLength)
			}
			req, _ := http.NewRequest(http.MethodHead, srv.URL+path, nil)
			resp, err = c.Do(req)
			require.NoError(t, err, "HEAD too")
			assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
			resp.Body.Close()
		})
	}
}

// chunkTransport answers every request with a 200 whose body, of the
// size the path's last number says, has no Content-Length and arrives in
// reads of at most 16 KiB, as a chunked or decompressed body does.
type chunkTransport struct{}

func (chunkTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var n int
	fmt.Sscanf(req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:], "%d", &n)
	return &http.Response{StatusCode: 200, Header: http.Header{}, ContentLength: -1, Request: req,
		Body: io.NopCloser(&smallReads{r: bytes.NewReader(make([]byte, n)), max: 16 << 10})}, nil
}

type smallReads struct {
	r   io.Reader
	max int
}

func (s *smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.max)]) }

// The bound holds for what the store holds, not for the lengths it
// counts: bodies of unknown length, read in pieces, are kept in buffers of
// their size, and small entries count what holds them, so that the live
// heap the store takes stays within 5% of MaxBytes.
func TestFallbackMemoryBoundChunked(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBytes int64
		calls    int
		size     func(i int) int
	}{
		{"300 KiB to 1 MiB", 16 << 20, 400, func(i int) int { return 300<<10 + (i*37<<10)%(700<<10) }},
		{"64 B", 4 << 20, 20_000, func(int) int { return 64 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			memoryBoundChunked(t, tc.maxBytes, tc.calls, tc.size)
		})
	}
}

func memoryBoundChunked(t *testing.T, maxBytes int64, calls int, size func(int) int) {
	h, err := NewHandler(Options{Fallback: FallbackOptions{Enabled: true, MaxBytes: maxBytes}})
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(chunkTransport{})}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range calls {
		resp, err := client.Get(fmt.Sprintf("http://upstream.test/item/%d/%d", i, size(i)))
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("live heap held by the store: %.2f MiB for a bound of %.2f MiB (counted: %.2f MiB)",
		float64(held)/(1<<20), float64(maxBytes)/(1<<20), float64(h.fbStore.bytes())/(1<<20))
	assert.LessOrEqual(t, h.fbStore.bytes(), maxBytes)
	assert.Greater(t, h.fbStore.bytes(), maxBytes*9/10, "the store fills up to its bound")
	assert.LessOrEqual(t, held, maxBytes*105/100, "live heap within 5% of the bound")

	// What the heap shows, deterministically: every body is held in a
	// buffer that its count covers.
	h.fbStore.mu.Lock()
	for el := h.fbStore.ll.Front(); el != nil; el = el.Next() {
		it := el.Value.(*lruItem)
		assert.LessOrEqual(t, int64(cap(it.e.Body)), it.size, it.key)
	}
	h.fbStore.mu.Unlock()
	runtime.KeepAlive(h)
}

// blockingStore is a mapStore whose Get, once blocking is set, says it
// was entered and then waits for release, ignoring its context; or, with
// onDone, waits for its context and answers then, as a store that answers
// just as the caller leaves.
type blockingStore struct {
	mapStore
	blocking atomic.Bool
	onDone   bool
	entered  chan struct{}
	release  chan struct{}
	running  sync.WaitGroup
	ctxs     chan context.Context // every ctx Get and Put are given, if not nil
}

func newBlockingStore() *blockingStore {
	return &blockingStore{mapStore: mapStore{m: map[string]*FallbackEntry{}},
		entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (s *blockingStore) Get(ctx context.Context, k string) (*FallbackEntry, bool) {
	if s.ctxs != nil {
		s.ctxs <- ctx
	}
	if s.blocking.Load() {
		s.running.Add(1)
		defer s.running.Done()
		s.entered <- struct{}{}
		if s.onDone {
			<-ctx.Done()
		} else {
			<-s.release
		}
	}
	return s.mapStore.Get(ctx, k)
}

func (s *blockingStore) Put(ctx context.Context, k string, e *FallbackEntry) {
	if s.ctxs != nil {
		s.ctxs <- ctx
	}
	s.mapStore.Put(ctx, k, e)
}

// A slow store never outlives its caller: a caller whose context is done
// while the store looks up its response gets its context's error at once,
// never the kept response, whether or not the store honours the context.
func TestFallbackSlowStoreCallerLeaves(t *testing.T) {
	var failing atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "kept")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name     string
		onDone   bool // the store answers when the context is done
		deadline bool // the caller's deadline passes, rather than a cancel
		status   bool // the call failed on a 503 (OnTransient), not on an open circuit
	}{
		{name: "store ignores ctx, caller cancels"},
		{name: "store ignores ctx, deadline passes", deadline: true},
		{name: "store answers as ctx is done", onDone: true},
		{name: "after a 503, store ignores ctx", status: true},
		{name: "after a 503, store answers as ctx is done", status: true, onDone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failing.Store(false)
			st := newBlockingStore()
			st.onDone = tc.onDone
			h, err := NewHandler(Options{
				Fallback: FallbackOptions{Enabled: true, Store: st, OnTransient: true},
				Retry:    RetryOptions{Disabled: true},
			})
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()
			resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, srv.URL+"/s", nil))
			require.NoError(t, err)
			require.Equal(t, "kept", readBody(t, resp))
			require.Len(t, st.keys(), 1)
			if tc.status {
				failing.Store(true)
			} else {
				h.IsolateCircuit()
			}
			st.blocking.Store(true)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			want := context.Canceled
			if tc.deadline {
				ctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				want = context.DeadlineExceeded
			}
			type answer struct {
				resp *http.Response
				err  error
			}
			got := make(chan answer, 1)
			req := newTestRequest(t, ctx, http.MethodGet, srv.URL+"/s", nil)
			go func() {
				resp, err := tr.RoundTrip(req)
				got <- answer{resp, err}
			}()
			<-st.entered
			if !tc.deadline {
				cancel()
			}
			select {
			case a := <-got:
				if a.resp != nil {
					a.resp.Body.Close()
				}
				assert.Nil(t, a.resp, "a caller that left is not answered")
				require.Error(t, a.err)
				assert.ErrorIs(t, a.err, want)
				assert.NotErrorIs(t, a.err, ErrFallbackRefused)
				assert.True(t, strings.HasPrefix(a.err.Error(), "resilience: "), a.err.Error())
			case <-time.After(10 * time.Second):
				t.Fatal("the caller was kept waiting for the store")
			}
			close(st.release)
			st.running.Wait()
		})
	}
}

// The store is given the caller's context.
func TestFallbackStoreGetsCallerContext(t *testing.T) {
	type key struct{}
	st := newBlockingStore()
	st.ctxs = make(chan context.Context, 10)
	fx := newFallbackFixture(t, FallbackOptions{Store: st})
	ctx := context.WithValue(context.Background(), key{}, "caller")
	for range 2 {
		resp, err := fx.client.Do(newTestRequest(t, ctx, http.MethodGet, fx.srv.URL+"/c", nil))
		require.NoError(t, err)
		readBody(t, resp)
		fx.h.IsolateCircuit()
	}
	close(st.ctxs)
	n := 0
	for c := range st.ctxs {
		assert.Equal(t, "caller", c.Value(key{}))
		n++
	}
	assert.Equal(t, 2, n, "one Put, one Get")
}

// Gets that outlive their callers are bounded: past maxLateStoreGets, the
// store is not asked and the call is refused (none kept) at once.
func TestFallbackLateStoreGetsBounded(t *testing.T) {
	st := newBlockingStore()
	st.entered = make(chan struct{}, maxLateStoreGets+1)
	fx := newFallbackFixture(t, FallbackOptions{Store: st})
	_, _, err := fx.do(t, "GET", "/b")
	require.NoError(t, err)
	fx.h.IsolateCircuit()
	st.blocking.Store(true)
	for range maxLateStoreGets {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		req := newTestRequest(t, ctx, http.MethodGet, fx.srv.URL+"/b", nil)
		go func() {
			_, err := fx.client.Do(req)
			done <- err
		}()
		<-st.entered
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = fx.client.Do(newTestRequest(t, ctx, http.MethodGet, fx.srv.URL+"/b", nil))
	refused(t, err, ErrFallbackNone)
	assert.Empty(t, st.entered, "the store was not asked")
	close(st.release)
	st.running.Wait()
	st.blocking.Store(false)
	require.Eventually(t, func() bool { return fx.h.fbLate.Load() == 0 }, 5*time.Second, time.Millisecond)
	resp, err := fx.client.Do(newTestRequest(t, ctx, http.MethodGet, fx.srv.URL+"/b", nil))
	require.NoError(t, err, "asked again once they returned")
	assert.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))
	readBody(t, resp)
}
