package resilience

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/server"
)

// wireRequest sends one GET through rt to ln, which keeps the bytes of the
// request it reads, and returns them.
func wireRequest(t *testing.T, ln net.Listener, rt http.RoundTripper, header http.Header) []byte {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer conn.Close()
		var buf bytes.Buffer
		r := bufio.NewReader(io.TeeReader(conn, &buf))
		for { // the request head, to its empty line
			line, err := r.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		got <- buf.Bytes()
	}()
	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/items?id=7", nil)
	require.NoError(t, err)
	req.Header = header
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	return <-got
}

// With Propagation off (the default), an attempt leaves byte for byte as
// the base alone would send it.
func TestPropagationOffLeavesTheWireAlone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	header := http.Header{"X-Caller": {"a"}, "Request-Budget-Ms": {"99"}}
	bare := &http.Transport{}
	defer bare.CloseIdleConnections()
	want := wireRequest(t, ln, bare, header.Clone())
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := NewTransport(base, Options{})
	require.NoError(t, err)
	assert.Equal(t, string(want), string(wireRequest(t, ln, tr, header.Clone())))
	assert.Contains(t, string(want), "Request-Budget-Ms: 99\r\n", "the caller's own header, untouched")
}

// budgetOf reads the contract's headers of a request a test upstream got.
func budgetOf(t *testing.T, h http.Header, names server.Headers) (time.Duration, int) {
	t.Helper()
	require.Len(t, h.Values(names.Budget), 1, "one budget")
	ms, err := strconv.ParseInt(h.Get(names.Budget), 10, 64)
	require.NoError(t, err)
	n, err := strconv.Atoi(h.Get(names.Attempt))
	require.NoError(t, err)
	return time.Duration(ms) * time.Millisecond, n
}

func TestPropagationSendsBudgetAndAttempt(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	tr, err := NewTransport(&http.Transport{}, Options{Propagation: PropagationOptions{Enabled: true}})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL(), nil)
	require.NoError(t, err)
	req.Header.Set("X-Caller", "a")
	req.Header["request-attempt"] = []string{"7"} // a caller's own spelling is replaced, not sent beside
	before := req.Header.Clone()
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	assert.Equal(t, before, req.Header, "the caller's header is not changed")

	names := server.DefaultHeaders()
	require.Len(t, seen, 2)
	for i, h := range seen {
		budget, n := budgetOf(t, h, names)
		assert.Equal(t, i+1, n)
		assert.LessOrEqual(t, budget, 2*time.Second, "the context's deadline, the soonest")
		assert.Greater(t, budget, time.Second)
		assert.Equal(t, "a", h.Get("X-Caller"))
		assert.Len(t, h.Values("Request-Attempt"), 1)
	}

	// Without a context deadline, and with attempts cut at their limit,
	// the attempt timeout is the soonest.
	seen = nil
	tr2, err := NewTransport(&http.Transport{}, Options{AttemptTimeout: 300 * time.Millisecond, StrictAttemptTimeout: true, Propagation: PropagationOptions{Enabled: true, Headers: server.EnvoyHeaders()}})
	require.NoError(t, err)
	defer tr2.CloseIdleConnections()
	req, err = http.NewRequest(http.MethodGet, up.URL(), nil)
	require.NoError(t, err)
	resp, err = tr2.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEmpty(t, seen)
	budget, n := budgetOf(t, seen[0], server.EnvoyHeaders())
	assert.Equal(t, 1, n)
	assert.LessOrEqual(t, budget, 300*time.Millisecond)
	assert.Greater(t, budget, 200*time.Millisecond)
	assert.Empty(t, seen[0].Get("Request-Budget-Ms"), "Envoy's names only")

	// Held attempts (the default) wait on past their limit while nothing
	// overtakes them: the budget is the total timeout's, so that a server
	// does not drop work its caller still waits for.
	seen = nil
	tr3, err := NewTransport(&http.Transport{}, Options{AttemptTimeout: 300 * time.Millisecond, TotalTimeout: 2 * time.Second, Propagation: PropagationOptions{Enabled: true}})
	require.NoError(t, err)
	defer tr3.CloseIdleConnections()
	req, err = http.NewRequest(http.MethodGet, up.URL(), nil)
	require.NoError(t, err)
	resp, err = tr3.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEmpty(t, seen)
	budget, _ = budgetOf(t, seen[0], server.DefaultHeaders())
	assert.LessOrEqual(t, budget, 2*time.Second)
	assert.Greater(t, budget, time.Second, "the total timeout's, not the attempt's")
}

func TestPropagationPushbackStops(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-Pushback-Ms", "-1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "too many retries")
	})
	rec := &evRecorder{}
	h, err := NewHandler(Options{Retry: RetryOptions{Delay: time.Millisecond}, Propagation: PropagationOptions{Enabled: true}, OnEvent: rec.add})
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(&http.Transport{})}
	full := h.budget.Level()
	resp, err := client.Get(up.URL())
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "too many retries", readBody(t, resp), "answered at once, with the server's response")
	assert.EqualValues(t, 1, up.requests.Load(), "never retried")
	assert.InDelta(t, full-1, h.budget.Level(), 1e-9, "it cost the budget a token, as a failed retry does")
	pushed := rec.of(EventPushback)
	require.Len(t, pushed, 1)
	assert.Equal(t, http.StatusServiceUnavailable, pushed[0].StatusCode)
	assert.Empty(t, rec.of(EventRetry))

	// Without Propagation the same answer is retried as any 503 is.
	up.requests.Store(0)
	plain, err := NewTransport(&http.Transport{}, Options{Retry: RetryOptions{Delay: time.Millisecond}})
	require.NoError(t, err)
	defer plain.CloseIdleConnections()
	resp, err = (&http.Client{Transport: plain}).Get(up.URL())
	require.NoError(t, err)
	resp.Body.Close()
	assert.EqualValues(t, 4, up.requests.Load())
}

func TestPropagationPushbackWait(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-Pushback-Ms", "40")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{Retry: RetryOptions{Delay: time.Millisecond}, Propagation: PropagationOptions{Enabled: true}, OnEvent: rec.add})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(up.URL())
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	retries := rec.of(EventRetry)
	require.Len(t, retries, 1)
	assert.Equal(t, 40*time.Millisecond, retries[0].Delay, "the pushback, longer than the Retry-After")
	assert.Empty(t, rec.of(EventPushback))
}

// Through the server half: the budget a service receives is the deadline of
// the calls it makes, and the next service receives less of it.
func TestPropagationThroughTheServerHalf(t *testing.T) {
	leafBudget := make(chan time.Duration, 1)
	leaf := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		b, _ := budgetOf(t, r.Header, server.DefaultHeaders())
		leafBudget <- b
	})
	next, err := NewTransport(&http.Transport{}, Options{Propagation: PropagationOptions{Enabled: true}})
	require.NoError(t, err)
	defer next.CloseIdleConnections()
	mid, err := server.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, leaf.URL(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp, err := next.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
	}), server.Options{})
	require.NoError(t, err)
	midSrv := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { mid.ServeHTTP(w, r) })

	front, err := NewTransport(&http.Transport{}, Options{AttemptTimeout: 800 * time.Millisecond, StrictAttemptTimeout: true, Propagation: PropagationOptions{Enabled: true}})
	require.NoError(t, err)
	defer front.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, midSrv.URL(), nil)
	require.NoError(t, err)
	resp, err := front.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	b := <-leafBudget
	assert.LessOrEqual(t, b, 800*time.Millisecond, "the front's attempt timeout, less what went by")
	assert.Greater(t, b, 400*time.Millisecond)
}

func TestPropagationConfig(t *testing.T) {
	for _, tc := range []struct {
		json string
		want server.Headers
	}{
		{`{"enabled": true}`, server.DefaultHeaders()},
		{`{"enabled": true, "headers": "neutral"}`, server.DefaultHeaders()},
		{`{"enabled": true, "headers": "envoy"}`, server.EnvoyHeaders()},
		{`{"enabled": true, "headers": {"budget": "x-deadline-ms"}}`, server.Headers{Budget: "X-Deadline-Ms", Attempt: "Request-Attempt", Pushback: "Retry-Pushback-Ms"}},
	} {
		cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"propagation": ` + tc.json + `}}}`))
		require.NoError(t, err, tc.json)
		h, err := NewHandler(cfg.Upstreams["a"])
		require.NoError(t, err)
		p := h.cfg.Load().Propagation
		assert.True(t, p.Enabled)
		assert.Equal(t, tc.want, p.Headers, tc.json)
	}
	for _, tc := range []struct{ json, want string }{
		{`{"headers": "istio"}`, `propagation.headers: want "neutral", "envoy" or an object`},
		{`{"headers": {"deadline": "x"}}`, `propagation.headers.deadline: unknown field`},
		{`{"headers": 5}`, `propagation.headers: want`},
	} {
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"propagation": ` + tc.json + `}}}`))
		require.ErrorContains(t, err, tc.want, tc.json)
	}
	_, err := NewHandler(Options{Propagation: PropagationOptions{Headers: server.Headers{Budget: "bad name"}}})
	require.ErrorContains(t, err, "Propagation.Headers.Budget")
	_, err = NewHandler(Options{Propagation: PropagationOptions{Headers: server.Headers{Budget: "Request-Attempt"}}})
	require.ErrorContains(t, err, `Propagation.Headers.Budget ("Request-Attempt")`, "the field written, not the default")
}
