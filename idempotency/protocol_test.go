package idempotency_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/resiliencetest"
)

var (
	reset = resiliencetest.Fault{Reset: true}
	pass  = resiliencetest.Fault{}
)

// middleware returns the protocol over b's store, principal by X-Tenant.
func middleware(t testing.TB, b *backend, o idempotency.Options) *idempotency.Middleware {
	if o.Principal == nil {
		o.Principal = byHeader
	}
	m, err := idempotency.New(b.store, o)
	require.NoError(t, err)
	return m
}

// lossy plays script on the responses of h: on a Reset fault h runs, then
// the connection is dropped with a TCP RST before any of its answer is
// sent, so the client cannot know whether the write happened.
func lossy(script *resiliencetest.Script, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := script.Next(); !f.Reset {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	})
}

// newClient is a client of an upstream that keeps the protocol: the
// standard handler with Options.Idempotency, over base.
func newClient(t testing.TB, base http.RoundTripper) *http.Client {
	rt, err := resilience.NewTransport(base, resilience.Options{
		Name:        "orders",
		Idempotency: resilience.IdempotencyOptions{Enabled: true},
		Retry:       resilience.RetryOptions{Delay: time.Millisecond},
	})
	require.NoError(t, err)
	return &http.Client{Transport: rt}
}

func newBase(t testing.TB) *http.Transport {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return base
}

func post(t testing.TB, url, body, key string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Tenant", "acme")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// answer reads and closes resp's body.
func answer(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

// A POST that creates a row, retried three times through
// connection resets with one key (the client's own), leaves one row, and
// the caller gets the original 201 and body. The first attempt never
// leaves the client; the second runs and commits but its answer is lost;
// the third is replayed and lost too; the fourth is replayed.
func TestRetriedPostCreatesOneRow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		app := &orders{b: b}
		responses := resiliencetest.Sequence(reset, reset, pass)
		srv := httptest.NewServer(lossy(responses, middleware(t, b, idempotency.Options{}).Handler(app)))
		defer srv.Close()
		requests := resiliencetest.NewTransport(newBase(t), resiliencetest.Sequence(reset, pass))

		resp, err := newClient(t, requests).Do(post(t, srv.URL, "widget", ""))
		require.NoError(t, err)
		body := answer(t, resp)

		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, `{"id":1,"item":"widget"}`, body)
		assert.Equal(t, "/orders/1", resp.Header.Get("Location"))
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
		assert.Equal(t, 4, requests.Requests(), "attempts: the first and three retries")
		assert.EqualValues(t, 1, app.runs.Load(), "the handler ran once")
		assert.Equal(t, 1, b.rows(t), "rows")
	})
}

// Two callers with one key, interleaved at the claim: the first claims and
// holds its transaction open; the second gets 409 with Retry-After, which
// lets the first finish; the second's client retries after the Retry-After
// and gets the first's 201 replayed. One row.
func TestInterleavedCallersOneRow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		inside, release := make(chan struct{}), make(chan struct{})
		var once, releaseOnce sync.Once
		app := &orders{b: b, before: func(*http.Request) {
			once.Do(func() { close(inside); <-release })
		}}
		mw := middleware(t, b, idempotency.Options{})
		var (
			mu       sync.Mutex
			statuses []int // of the second caller's attempts
		)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Caller") != "second" {
				mw.Handler(app).ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			mw.Handler(app).ServeHTTP(rec, r)
			mu.Lock()
			statuses = append(statuses, rec.Code)
			mu.Unlock()
			if rec.Code == http.StatusConflict {
				assert.Equal(t, "1", rec.Header().Get("Retry-After"))
				releaseOnce.Do(func() { close(release) }) // let the first finish
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		}))
		defer srv.Close()
		client := newClient(t, newBase(t))
		const key = "6c1f9f5e-6a43-4c55-9b1e-0f5cf2b5a0d1"

		first := make(chan *http.Response, 1)
		go func() {
			resp, err := client.Do(post(t, srv.URL, "widget", key))
			assert.NoError(t, err)
			first <- resp
		}()
		<-inside
		req := post(t, srv.URL, "widget", key)
		req.Header.Set("X-Caller", "second")
		resp2, err := client.Do(req)
		require.NoError(t, err)
		resp1 := <-first
		require.NotNil(t, resp1)
		body1, body2 := answer(t, resp1), answer(t, resp2)

		assert.Equal(t, http.StatusCreated, resp1.StatusCode)
		assert.Empty(t, resp1.Header.Get(idempotency.ReplayedHeader))
		assert.Equal(t, http.StatusCreated, resp2.StatusCode)
		assert.Equal(t, "true", resp2.Header.Get(idempotency.ReplayedHeader))
		assert.Equal(t, body1, body2)
		assert.Equal(t, []int{http.StatusConflict, http.StatusCreated}, statuses)
		assert.EqualValues(t, 1, app.runs.Load())
		assert.Equal(t, 1, b.rows(t))
	})
}

// The same key with a different body is a conflict: 422, never retried,
// nothing written.
func TestSameKeyDifferentBodyIs422(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		app := &orders{b: b}
		srv := httptest.NewServer(middleware(t, b, idempotency.Options{}).Handler(app))
		defer srv.Close()
		requests := resiliencetest.NewTransport(newBase(t), nil)
		client := newClient(t, requests)
		const key = "k-422"

		resp, err := client.Do(post(t, srv.URL, "widget", key))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		answer(t, resp)

		resp, err = client.Do(post(t, srv.URL, "gadget", key))
		require.NoError(t, err)
		assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		assert.Contains(t, answer(t, resp), "different request")
		assert.Equal(t, 2, requests.Requests(), "the 422 is not retried")
		assert.EqualValues(t, 1, app.runs.Load())
		assert.Equal(t, 1, b.rows(t))
	})
}
