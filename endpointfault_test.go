package resilience

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An endpoint that fails every attempt in a way that is not transient for
// it, but says nothing of the other endpoints: a TLS failure.
type faultyEndpoint struct {
	name string
	url  string
	is   func(error) bool // what the attempt's error must be
}

// faultyEndpoints returns an https server whose certificate the client does
// not trust, and an https URL pointed at a plain-http server.
func faultyEndpoints(t *testing.T) []faultyEndpoint {
	untrusted := httptest.NewUnstartedServer(answer("untrusted"))
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // each handshake the client refuses is logged
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	plain := httptest.NewServer(answer("plain"))
	t.Cleanup(plain.Close)
	return []faultyEndpoint{
		{"untrusted certificate", untrusted.URL, func(err error) bool {
			var unknown x509.UnknownAuthorityError
			return errors.As(err, &unknown)
		}},
		{"https to a plain-http port", "https://" + strings.TrimPrefix(plain.URL, "http://"), func(err error) bool {
			var record tls.RecordHeaderError
			return errors.As(err, &record)
		}},
	}
}

// breakerFailures returns how many failures the circuit breaker of the
// endpoint at base has recorded.
func breakerFailures(t *testing.T, h *Handler, base string) uint {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	s := h.hosts.get(u)
	defer h.hosts.release(s)
	return s.breaker().Metrics().Failures()
}

// endpointTrace records the endpoint and the error of every attempt.
type endpointTrace struct {
	mu    sync.Mutex
	order []string
	errs  map[string]error
}

func (tr *endpointTrace) add(e Event) {
	if e.Kind != EventAttempt {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.order = append(tr.order, e.Endpoint)
	if tr.errs == nil {
		tr.errs = map[string]error{}
	}
	if e.Err != nil {
		tr.errs[e.Endpoint] = e.Err
	}
}

func (tr *endpointTrace) snapshot() ([]string, map[string]error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.order...), tr.errs
}

// Issue 18, item 6: without hedging, an attempt that fails with a TLS error
// on one endpoint fails over to the next one, and the failure counts
// against the failed endpoint's own circuit.
func TestEndpointsTLSFailureFailsOver(t *testing.T) {
	healthy := newReplica(t, answer("healthy"))
	for _, bad := range faultyEndpoints(t) {
		t.Run(bad.name, func(t *testing.T) {
			trace := &endpointTrace{}
			tr, err := NewTransport(&http.Transport{}, Options{
				PerHost:   PerHostOptions{Enabled: true},
				Retry:     RetryOptions{Delay: -1},
				Endpoints: []Endpoint{{URL: bad.url}, {URL: healthy.URL}},
				OnEvent:   trace.add,
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()

			var report Report
			req, err := http.NewRequestWithContext(WithReport(context.Background(), &report), http.MethodGet, "http://orders.invalid/", nil)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err, "the healthy endpoint answers")
			assert.Equal(t, "healthy", readBody(t, resp))
			assert.Equal(t, 2, report.Attempts)
			order, errs := trace.snapshot()
			assert.Equal(t, []string{bad.url, healthy.URL}, order)
			assert.True(t, bad.is(errs[bad.url]), "the first attempt failed with the TLS error: %v", errs[bad.url])
			assert.EqualValues(t, 1, breakerFailures(t, tr.Handler(), bad.url), "counted against the failed endpoint")
			assert.Zero(t, breakerFailures(t, tr.Handler(), healthy.URL))
		})
	}
}

// Issue 18, item 6: a TLS failure is never retried against the endpoint
// that failed: with one endpoint the call ends on it at once; with another
// that keeps failing transiently, the retries all go to that one.
func TestEndpointsTLSFailureNotRetriedOnSameEndpoint(t *testing.T) {
	bad := faultyEndpoints(t)[0]
	trace := &endpointTrace{}
	tr, err := NewTransport(&http.Transport{}, Options{
		PerHost:   PerHostOptions{Enabled: true},
		Retry:     RetryOptions{Delay: -1, MaxRetries: 3},
		Endpoints: []Endpoint{{URL: bad.url}},
		OnEvent:   trace.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, "http://orders.invalid/", nil)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.True(t, bad.is(err), "the caller gets the TLS error: %v", err)
	assert.True(t, strings.HasPrefix(err.Error(), "resilience: "), err.Error())
	order, _ := trace.snapshot()
	assert.Equal(t, []string{bad.url}, order, "one attempt: nowhere else to go")

	busy := newReplica(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) })
	trace = &endpointTrace{}
	tr2, err := NewTransport(&http.Transport{}, Options{
		PerHost:   PerHostOptions{Enabled: true},
		Retry:     RetryOptions{Delay: -1, MaxRetries: 3},
		Endpoints: []Endpoint{{URL: bad.url}, {URL: busy.URL}},
		OnEvent:   trace.add,
	})
	require.NoError(t, err)
	defer tr2.CloseIdleConnections()
	req, _ = http.NewRequest(http.MethodGet, "http://orders.invalid/", nil)
	resp, err := tr2.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the last answer")
	resp.Body.Close()
	order, _ = trace.snapshot()
	assert.Equal(t, []string{bad.url, busy.URL, busy.URL, busy.URL}, order)
}

// Issue 18, item 6: with hedging, a TLS failure on one endpoint sends the
// next hedge at once to another, and while a hedge to a healthy endpoint
// runs, the call waits for it instead of ending on the failure.
func TestEndpointsTLSFailureHedged(t *testing.T) {
	for _, bad := range faultyEndpoints(t) {
		t.Run(bad.name+", first", func(t *testing.T) {
			healthy := newReplica(t, answer("healthy"))
			trace := &endpointTrace{}
			tr, err := NewTransport(&http.Transport{}, Options{
				Hedging:   HedgingOptions{Enabled: true, Delay: time.Hour},
				Endpoints: []Endpoint{{URL: bad.url}, {URL: healthy.URL}},
				OnEvent:   trace.add,
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			_, body := routedGet(t, tr, "http://orders.invalid/")
			assert.Equal(t, "healthy", body)
			order, errs := trace.snapshot()
			assert.Equal(t, []string{bad.url, healthy.URL}, order)
			assert.True(t, bad.is(errs[bad.url]), "%v", errs[bad.url])
			assert.EqualValues(t, 1, breakerFailures(t, tr.Handler(), bad.url))
		})
		t.Run(bad.name+", while a hedge runs", func(t *testing.T) {
			failed := make(chan struct{})
			var once sync.Once
			slow := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-failed: // answers only once the other endpoint has failed
					_, _ = io.WriteString(w, "slow")
				case <-r.Context().Done():
				}
			})
			tr, err := NewTransport(&http.Transport{}, Options{
				Hedging:   HedgingOptions{Enabled: true, Delay: time.Millisecond},
				Endpoints: []Endpoint{{URL: slow.URL}, {URL: bad.url}},
				OnEvent: func(e Event) {
					if e.Kind == EventAttempt && e.Endpoint == bad.url {
						once.Do(func() { close(failed) })
					}
				},
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, "http://orders.invalid/", nil)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err, "the running attempt's answer, not the other endpoint's TLS failure")
			assert.Equal(t, "slow", readBody(t, resp))
			// The failure is judged in its attempt's goroutine, which may
			// end after the call does.
			require.Eventually(t, func() bool { return breakerFailures(t, tr.Handler(), bad.url) == 1 },
				5*time.Second, time.Millisecond, "counted against the failed endpoint")
		})
	}
}

// Issue 18, item 7: a Retry-After speaks for the endpoint that sent it.
// Failover to another endpoint waits the backoff only; a retry to the same
// endpoint still honours it. Retry-After: 5 does not fit in the total
// timeout of 3s, so a call that honoured it would answer with the 503 at
// once: the wait chosen is read from the EventRetry and the Report, not
// from a clock.
func TestEndpointsFailoverIgnoresOtherEndpointsRetryAfter(t *testing.T) {
	throttled := newReplica(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "later", http.StatusServiceUnavailable)
	})
	healthy := newReplica(t, answer("healthy"))
	options := func(rec *evRecorder, eps ...*replica) Options {
		return Options{
			PerHost:      PerHostOptions{Enabled: true},
			TotalTimeout: 3 * time.Second, AttemptTimeout: time.Second,
			Retry:     RetryOptions{Delay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
			Endpoints: endpointsOf(eps...),
			OnEvent:   rec.add,
		}
	}
	get := func(t *testing.T, tr http.RoundTripper) (*http.Response, *Report) {
		var report Report
		req, err := http.NewRequestWithContext(WithReport(context.Background(), &report), http.MethodGet, "http://orders.invalid/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		return resp, &report
	}

	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, options(rec, throttled, healthy))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	resp, report := get(t, tr)
	assert.Equal(t, "healthy", readBody(t, resp), "failed over without waiting for the other endpoint's Retry-After")
	assert.Equal(t, 2, report.Attempts)
	retries := rec.of(EventRetry)
	require.Len(t, retries, 1)
	assert.LessOrEqual(t, retries[0].Delay, 10*time.Millisecond, "the backoff, not the Retry-After")
	assert.LessOrEqual(t, report.Waited, 10*time.Millisecond)

	// The same endpoint again: its Retry-After holds, and since it does not
	// fit in the total timeout the caller gets the 503 at once.
	rec = &evRecorder{}
	tr2, err := NewTransport(&http.Transport{}, options(rec, throttled))
	require.NoError(t, err)
	defer tr2.CloseIdleConnections()
	resp, report = get(t, tr2)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp.Body.Close()
	assert.Equal(t, 1, report.Attempts)
	assert.Empty(t, rec.of(EventRetry))
}
