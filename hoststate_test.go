package resilience

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func perHostOptions(rec *evRecorder) Options {
	o := cbOptions(rec, cbLongBreak)
	o.PerHost = PerHostOptions{Enabled: true}
	o.RateLimit = RateLimitOptions{MaxConcurrent: 1}
	return o
}

// One bad host among several cannot open the circuit for the rest.
func TestPerHostIsolatesCircuits(t *testing.T) {
	bad := cbNewUpstream(http.StatusServiceUnavailable)
	defer bad.Close()
	good := cbNewUpstream(http.StatusOK)
	defer good.Close()
	rec := &evRecorder{}
	h, err := NewHandler(perHostOptions(rec))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, bad, 4)
	_, err = cbGet(t, tr, bad.URL)
	require.ErrorIs(t, err, ErrCircuitOpen, "the bad host's circuit is open")
	assert.Contains(t, err.Error(), "503")
	assert.EqualValues(t, 4, bad.hits.Load(), "the rejected call never reached the bad host")

	for i := 0; i < 10; i++ {
		status, err := cbGet(t, tr, good.URL)
		require.NoError(t, err, "the good host's calls keep flowing")
		assert.Equal(t, http.StatusOK, status)
	}
	assert.EqualValues(t, 10, good.hits.Load())

	badKey, goodKey := keyOf(mustURL(t, bad.URL)).String(), keyOf(mustURL(t, good.URL)).String()
	assert.Equal(t, map[string]CircuitState{badKey: CircuitOpen, goodKey: CircuitClosed}, h.HostCircuitStates())
	assert.Equal(t, CircuitOpen, h.CircuitState(), "the handler reports its least healthy host")

	opened := rec.of(EventCircuitOpened)
	require.Len(t, opened, 1)
	assert.Equal(t, badKey, opened[0].Host, "the event names the host whose circuit opened")

	h.CloseCircuit()
	assert.Equal(t, CircuitClosed, h.CircuitState(), "CloseCircuit closes every host's circuit")
	h.IsolateCircuit()
	_, err = cbGet(t, tr, good.URL)
	require.ErrorIs(t, err, ErrCircuitOpen, "isolation holds every host")
	assert.Equal(t, map[string]CircuitState{badKey: CircuitIsolated, goodKey: CircuitIsolated}, h.HostCircuitStates())
	h.CloseCircuit()
}

// Each host has a concurrency limit of its own: a host that holds its only
// permit does not block another host.
func TestPerHostIsolatesLimits(t *testing.T) {
	slow := cbNewUpstream(http.StatusOK)
	defer slow.Close()
	defer slow.unblock()
	fast := cbNewUpstream(http.StatusOK)
	defer fast.Close()
	h, err := NewHandler(perHostOptions(&evRecorder{}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	done := make(chan error, 1)
	go func() {
		_, err := cbCall(t.Context(), tr, slow.URL, true)
		done <- err
	}()
	slow.waitArrived(t)
	_, err = cbGet(t, tr, slow.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the slow host's only permit is taken")
	status, err := cbGet(t, tr, fast.URL)
	require.NoError(t, err, "another host has its own permit")
	assert.Equal(t, http.StatusOK, status)
	slow.unblock()
	require.NoError(t, <-done)
}

func TestPerHostForgetsHosts(t *testing.T) {
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true, MaxHosts: 2, IdleTimeout: time.Hour}})
	require.NoError(t, err)
	a, b, c := mustURL(t, "http://a.test/x"), mustURL(t, "http://b.test/y"), mustURL(t, "http://c.test/z")
	sa := h.hosts.get(a)
	h.hosts.release(sa)
	h.hosts.release(h.hosts.get(b))
	sa2 := h.hosts.get(a)
	h.hosts.release(sa2)
	assert.Same(t, sa, sa2, "a known host keeps its state")
	h.hosts.release(h.hosts.get(c)) // one more than MaxHosts: the least recently used (b) goes
	assert.Len(t, h.HostCircuitStates(), 2)
	assert.Contains(t, h.HostCircuitStates(), "http://a.test")
	assert.NotContains(t, h.HostCircuitStates(), "http://b.test")

	h, err = NewHandler(Options{PerHost: PerHostOptions{Enabled: true, IdleTimeout: time.Millisecond}})
	require.NoError(t, err)
	h.hosts.release(h.hosts.get(a))
	time.Sleep(5 * time.Millisecond) // longer than IdleTimeout: a is idle whatever the scheduling
	h.hosts.release(h.hosts.get(b))
	assert.Equal(t, map[string]CircuitState{"http://b.test": CircuitClosed}, h.HostCircuitStates(), "an idle host is forgotten")
}

func TestPerHostKey(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"http://example.com/a", "HTTP://Example.COM:80/b"},
		{"https://example.com", "https://example.com:443/"},
	} {
		assert.Equal(t, keyOf(mustURL(t, tc.a)), keyOf(mustURL(t, tc.b)), "%s and %s are one authority", tc.a, tc.b)
	}
	assert.NotEqual(t, keyOf(mustURL(t, "http://example.com")), keyOf(mustURL(t, "https://example.com")))
	assert.NotEqual(t, keyOf(mustURL(t, "http://example.com:8080")), keyOf(mustURL(t, "http://example.com")))
	assert.Equal(t, "https://example.com:8443", keyOf(mustURL(t, "https://Example.com:8443/x")).String())
}

func TestPerHostOptionsInvalid(t *testing.T) {
	_, err := NewHandler(Options{PerHost: PerHostOptions{MaxHosts: -1}})
	require.ErrorContains(t, err, "PerHost.MaxHosts")
	_, err = NewHandler(Options{PerHost: PerHostOptions{IdleTimeout: -time.Second}})
	require.ErrorContains(t, err, "PerHost.IdleTimeout")
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func TestPerHostNilURL(t *testing.T) {
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true}})
	require.NoError(t, err)
	body := newTestTrackingBody([]byte("x"))
	_, err = h.Transport(nil).RoundTrip(&http.Request{Method: http.MethodPost, Header: http.Header{}, Body: body})
	require.ErrorContains(t, err, "nil Request.URL")
	assert.True(t, body.closed.Load(), "the body is closed even so")
}
