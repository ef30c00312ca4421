package resilience

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 29, item 4: a move to another endpoint after a connection-level
// failure (the dial or the TLS handshake failed, or the connection was
// reset or closed before a response came) goes at once; the backoff applies
// when an endpoint the call already tried is tried again.

// refusingURL returns the URL of a loopback port that refuses connections:
// one that was listened on, then closed.
func refusingURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

// hangUp returns a replica that hijacks each request's connection and
// closes it without answering: with a TCP RST when reset is true, with a
// FIN (the client reads EOF) otherwise.
func hangUp(t *testing.T, reset bool) *replica {
	return newReplica(t, func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	})
}

// failoverGet sends a request through tr with a Report, and returns the
// Report and the response or error.
func failoverGet(t *testing.T, tr http.RoundTripper, method string) (*Report, *http.Response, error) {
	t.Helper()
	var report Report
	req, err := http.NewRequestWithContext(WithReport(context.Background(), &report), method, "http://orders.invalid/", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	return &report, resp, err
}

// delays returns the Delay of each EventRetry rec saw.
func delays(rec *evRecorder) []time.Duration {
	var ds []time.Duration
	for _, e := range rec.of(EventRetry) {
		ds = append(ds, e.Delay)
	}
	return ds
}

// With the default retry options (a 2 s ±50% backoff), a GET whose first
// endpoint fails at the connection level goes to the second at once.
func TestFailoverAfterConnectionFailureGoesAtOnce(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	untrusted := faultyEndpoints(t)[0].url
	for _, c := range []struct {
		name, url string
	}{
		{"connection refused", refusingURL(t)},
		{"closed before any byte", hangUp(t, false).URL},
		{"reset before any byte", hangUp(t, true).URL},
		{"TLS failure", untrusted},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &evRecorder{}
			tr, err := NewTransport(&http.Transport{}, Options{
				Endpoints: []Endpoint{{URL: c.url}, {URL: healthy.URL}},
				OnEvent:   rec.add,
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()

			report, resp, err := failoverGet(t, tr, http.MethodGet)
			require.NoError(t, err)
			assert.Equal(t, "healthy", readBody(t, resp))
			assert.Equal(t, 2, report.Attempts)
			assert.Equal(t, []time.Duration{0}, delays(rec), "the failover waited no backoff")
		})
	}
}

// The same with weighted routing: the heavy endpoint refuses, and the
// retry goes at once to the one the call has not tried.
func TestFailoverWeightedAfterRefusedDialGoesAtOnce(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Routing:   RouteWeighted,
		Endpoints: []Endpoint{{URL: refusingURL(t), Weight: 1_000_000}, {URL: healthy.URL, Weight: 1}},
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	tr.Handler().rand = func(uint64) uint64 { return 0 } // the first endpoint with weight left

	report, resp, err := failoverGet(t, tr, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, "healthy", readBody(t, resp))
	assert.Equal(t, 2, report.Attempts)
	assert.Equal(t, []time.Duration{0}, delays(rec))
}

// Two endpoints that both refuse: A, then B at once, then A again after
// the first backoff delay, then B after the second. Only the retries that
// went back to an endpoint claimed a budget token: the move to B sent the
// request to a server for the first time.
func TestFailoverBackoffWhenAnEndpointIsTriedAgain(t *testing.T) {
	a, b := refusingURL(t), refusingURL(t)
	rec := &evRecorder{measures: true}
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:     RetryOptions{Delay: 20 * time.Millisecond, MaxDelay: time.Second, NoJitter: true, MaxRetries: 3},
		Endpoints: []Endpoint{{URL: a}, {URL: b}},
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	report, _, err := failoverGet(t, tr, http.MethodGet)
	require.Error(t, err)
	assert.Equal(t, 4, report.Attempts)
	var order []string
	for _, e := range rec.of(EventAttempt) {
		order = append(order, e.Endpoint)
	}
	assert.Equal(t, []string{a, b, a, b}, order)
	assert.Equal(t, []time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond}, delays(rec),
		"at once to B, then the backoff sequence from its start")
	bud := tr.Handler().budget
	assert.Equal(t, float64(defaultBudgetTokens-2), bud.Level(), "two failed retries took a token each; the failover to B none")
	assert.Zero(t, bud.InFlight(), "every claim settled")
}

// What keeps its backoff: a failover after an answer (a 503 without
// Retry-After) or after an attempt timeout (the request may be running on
// the first endpoint), and a retry to the same host without Endpoints.
func TestFailoverKeepsBackoff(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	quick := RetryOptions{Delay: 20 * time.Millisecond, MaxDelay: time.Second, NoJitter: true, MaxRetries: 1}
	busy := newReplica(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) })
	stuck := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(stuck) }) })
	slow := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stuck:
		}
	})
	for _, c := range []struct {
		name   string
		opts   Options
		target string
	}{
		{"after a 503", Options{Retry: quick, Endpoints: endpointsOf(busy, healthy)}, ""},
		{"after an attempt timeout", Options{Retry: quick, AttemptTimeout: 20 * time.Millisecond, StrictAttemptTimeout: true, Endpoints: endpointsOf(slow, healthy)}, ""},
		{"refused, without Endpoints", Options{Retry: quick}, refusingURL(t)},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &evRecorder{}
			c.opts.OnEvent = rec.add
			tr, err := NewTransport(&http.Transport{}, c.opts)
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			target := "http://orders.invalid/"
			if c.target != "" {
				target = c.target
			}
			req, err := http.NewRequest(http.MethodGet, target, nil)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			assert.Equal(t, []time.Duration{20 * time.Millisecond}, delays(rec))
		})
	}
}

// The method rule holds: a POST whose first endpoint refuses is not
// retried, at once or later.
func TestFailoverMethodRule(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	tr, err := NewTransport(&http.Transport{}, Options{
		Endpoints: []Endpoint{{URL: refusingURL(t)}, {URL: healthy.URL}},
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	report, _, err := failoverGet(t, tr, http.MethodPost)
	require.Error(t, err)
	assert.Equal(t, 1, report.Attempts)
	assert.Zero(t, healthy.hits.Load())
}

// DelayFunc is asked about an immediate failover too, told a computed
// delay of 0; its answer is waited.
func TestFailoverDelayFunc(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	var mu sync.Mutex
	var told []time.Duration
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry: RetryOptions{DelayFunc: func(i DelayInfo) time.Duration {
			mu.Lock()
			told = append(told, i.Delay)
			mu.Unlock()
			return 5 * time.Millisecond
		}},
		Endpoints: []Endpoint{{URL: refusingURL(t)}, {URL: healthy.URL}},
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	_, resp, err := failoverGet(t, tr, http.MethodGet)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []time.Duration{0}, told)
	assert.Equal(t, []time.Duration{5 * time.Millisecond}, delays(rec))
}

// An untried endpoint whose circuit is open is passed over: the retry would
// land on the endpoint that just refused, so it waits the backoff. (Going
// at once would send A up to MaxRetries refused dials in a row.)
func TestFailoverOpenCircuitKeepsBackoff(t *testing.T) {
	a := refusingURL(t)
	open := newReplica(t, answer("open"))
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:     RetryOptions{Delay: 20 * time.Millisecond, MaxDelay: time.Second, NoJitter: true, MaxRetries: 3},
		Endpoints: []Endpoint{{URL: a}, {URL: open.URL}},
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	h := tr.Handler()
	u, err := url.Parse(open.URL)
	require.NoError(t, err)
	s := h.hosts.get(u)
	s.breaker().Open()
	h.hosts.release(s)

	report, _, err := failoverGet(t, tr, http.MethodGet)
	require.Error(t, err)
	assert.Equal(t, 4, report.Attempts, "every attempt went to A")
	assert.Zero(t, open.hits.Load())
	assert.Equal(t, []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}, delays(rec))
}
