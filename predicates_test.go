package resilience

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIsTransientStatuses(t *testing.T) {
	for _, code := range []int{408, 429, 500, 502, 503, 504, 507, 599} {
		assert.True(t, IsTransient(&http.Response{StatusCode: code}, nil), "%d", code)
	}
	for _, code := range []int{200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 422, 501, 505} {
		assert.False(t, IsTransient(&http.Response{StatusCode: code}, nil), "%d", code)
	}
	assert.False(t, IsTransient(nil, nil))
}

func TestIsTransientErrors(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"attempt timeout", ErrAttemptTimeout, true},
		{"wrapped attempt timeout", fmt.Errorf("x: %w", ErrAttemptTimeout), true},
		{"caller cancellation", context.Canceled, false},
		{"wrapped caller cancellation", fmt.Errorf("op: %w", context.Canceled), false},
		{"caller deadline", context.DeadlineExceeded, false},
		{"total timeout", ErrTotalTimeout, false},
		{"wrapped total timeout", fmt.Errorf("x: %w", ErrTotalTimeout), false},
		{"wrapped *net.OpError", fmt.Errorf("dialing: %w", opErr), true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"EOF", io.EOF, true},
		{"certificate verification", &tls.CertificateVerificationError{Err: errors.New("x509: certificate signed by unknown authority")}, false},
		{"tls alert", tls.AlertError(42), false},
		{"tls record header", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false},
		{"unsupported scheme", errors.New(`unsupported protocol scheme "ftp"`), false},
		{"invalid header", errors.New(`net/http: invalid header field name "a b"`), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, IsTransient(nil, tc.err))
			// An error decides, whatever response comes with it.
			assert.Equal(t, tc.want, IsTransient(&http.Response{StatusCode: 200}, tc.err))
		})
	}
}

// predRetryOptions retries GETs quickly and records events.
func predRetryOptions(rec *evRecorder) Options {
	return Options{
		Name:           "pred-test",
		Retry:          RetryOptions{MaxRetries: 3, Delay: time.Millisecond, NoJitter: true},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent:        rec.add,
	}
}

func TestIsTransientTLSVerificationFailure(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are expected
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()

	// A plain client does not trust the test certificate.
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := base.RoundTrip(req)
	require.Error(t, err)
	require.Nil(t, resp)
	var verr *tls.CertificateVerificationError
	assert.ErrorAs(t, err, &verr)
	assert.False(t, IsTransient(nil, err), "certificate failure: %v", err)
	assert.EqualValues(t, 1, conns.Load())

	// Through the handler, with retries on: one handshake, no retry.
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, predRetryOptions(rec))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	before := conns.Load()
	_, err = cbGet(t, tr, srv.URL)
	require.Error(t, err)
	assert.ErrorAs(t, err, &verr, "the cause stays visible")
	assert.Contains(t, err.Error(), `handler "pred-test"`)
	assert.Equal(t, before+1, conns.Load(), "a certificate failure is not retried")
	assert.Zero(t, rec.count(EventRetry))
}

func TestIsTransientUnsupportedScheme(t *testing.T) {
	base := &http.Transport{}
	req, err := http.NewRequest(http.MethodGet, "ftp://example.invalid/file", nil)
	require.NoError(t, err)
	_, err = base.RoundTrip(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unsupported protocol scheme")
	assert.False(t, IsTransient(nil, err))

	rec := &evRecorder{}
	tr, err := NewTransport(base, predRetryOptions(rec))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := client.Get("ftp://example.invalid/file")
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unsupported protocol scheme")
	assert.Zero(t, rec.count(EventRetry), "an unsupported scheme is not retried")
	assert.Empty(t, rec.all())
}

func TestIsTransientMalformedRequestNotRetried(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, predRetryOptions(rec))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header["Bad Header"] = []string{"x"} // a space is not allowed in a field name
	resp, err := tr.RoundTrip(req)
	require.Error(t, err)
	require.Nil(t, resp)
	assert.Contains(t, err.Error(), "invalid header field name")
	assert.False(t, IsTransient(nil, err))
	assert.Zero(t, rec.count(EventRetry))
	assert.Zero(t, hits.Load())
}

func TestIsTransientBrokenConnectionRetried(t *testing.T) {
	// The other side of the rule: a transport error that may pass is retried.
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // no response at all
		}
	}))
	defer srv.Close()

	rec := &evRecorder{}
	opts := predRetryOptions(rec)
	opts.Retry.MaxRetries = 2
	tr, err := NewTransport(&http.Transport{}, opts)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	_, err = cbGet(t, tr, srv.URL)
	require.Error(t, err)
	assert.True(t, IsTransient(nil, err), "%v", err)
	assert.Equal(t, 2, rec.count(EventRetry))
	for _, e := range rec.of(EventRetry) {
		assert.Error(t, e.Err, "a retry after an error carries it")
	}
	assert.EqualValues(t, 3, hits.Load())
	assert.Contains(t, err.Error(), "after 3 attempts")
}

// Issue 13: ShouldRetry decides per request: it sees the caller's request
// (here a header the caller set) with the attempt's outcome.
func TestShouldRetrySeesTheRequest(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusConflict) // not transient: retried only if ShouldRetry says so
	})
	var seen atomic.Int64
	c := newTestClient(t, Options{Retry: RetryOptions{
		MaxRetries: 2, Delay: time.Millisecond, NoJitter: true,
		ShouldRetry: func(req *http.Request, resp *http.Response, err error) bool {
			seen.Add(1)
			return err == nil && resp.StatusCode == http.StatusConflict && req.Header.Get("X-Retry-Conflicts") == "yes"
		},
	}})
	for _, tc := range []struct {
		header   string
		attempts int64
	}{{"yes", 3}, {"", 1}} {
		c.attempts.n.Store(0)
		req := newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil)
		req.Header.Set("X-Retry-Conflicts", tc.header)
		resp, err := c.Do(req)
		require.NoError(t, err)
		readBody(t, resp)
		assert.Equal(t, http.StatusConflict, resp.StatusCode)
		assert.Equal(t, tc.attempts, c.attempts.n.Load(), "header %q", tc.header)
	}
	assert.EqualValues(t, 4, seen.Load())
}

// A name that does not exist will not exist on the next attempt: a
// *net.DNSError that says IsNotFound is not transient. A lookup that timed
// out or a server's temporary failure may pass, and so may a DNS error that
// says neither (a misbehaving server). Classified by type, under the
// wrappers net/http puts around a dial's error.
func TestIsTransientDNSErrors(t *testing.T) {
	notFound := &net.DNSError{Err: "no such host", Name: "missing.invalid", IsNotFound: true}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"not found", notFound, false},
		{"not found, dialing", &net.OpError{Op: "dial", Net: "tcp", Err: notFound}, false},
		{"not found, in a *url.Error", &url.Error{Op: "Get", URL: "http://missing.invalid/", Err: &net.OpError{Op: "dial", Net: "tcp", Err: notFound}}, false},
		{"not found, wrapped", fmt.Errorf("lookup: %w", notFound), false},
		{"timeout", &net.DNSError{Err: "i/o timeout", Name: "slow.example", IsTimeout: true}, true},
		{"timeout, dialing", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", IsTimeout: true}}, true},
		{"temporary server failure", &net.DNSError{Err: "server misbehaving", Name: "flaky.example", IsTemporary: true}, true},
		{"not found, but temporary", &net.DNSError{Err: "no such host", IsNotFound: true, IsTemporary: true}, true},
		{"neither", &net.DNSError{Err: "server misbehaving", Name: "odd.example"}, true},
		{"no such host in another error's text", errors.New("lookup missing.invalid: no such host"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, IsTransient(nil, tc.err), "%v", tc.err)
		})
	}
}

// dnsBase is a transport whose dials to the host missing.invalid fail as a
// lookup that finds no such name does, with the *net.DNSError a dialer
// returns; the others are dialled. It counts the dials to missing.invalid.
func dnsBase(missed *atomic.Int64) *http.Transport {
	var d net.Dialer
	return &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, _, _ := net.SplitHostPort(addr); host == "missing.invalid" {
			missed.Add(1)
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}}
		}
		return d.DialContext(ctx, network, addr)
	}}
}

// Issue 47, item 16: a GET to a host whose name does not exist fails at
// once, as it does bare, instead of four attempts and 11 s later; the
// error still says what it was. With Endpoints, such a name is its
// endpoint's fault: the call moves on to the next endpoint.
func TestNameNotFoundNotRetried(t *testing.T) {
	var bareDials, dials atomic.Int64
	bare := dnsBase(&bareDials)
	defer bare.CloseIdleConnections()
	_, err := (&http.Client{Transport: bare}).Get("http://missing.invalid/")
	var dnsErr *net.DNSError
	require.ErrorAs(t, err, &dnsErr)
	require.True(t, dnsErr.IsNotFound)
	require.EqualValues(t, 1, bareDials.Load())

	rec := &evRecorder{}
	base := dnsBase(&dials)
	defer base.CloseIdleConnections()
	tr, err := NewTransport(base, Options{Retry: quickRetry(), OnEvent: rec.add})
	require.NoError(t, err)
	var report Report
	req := newTestRequest(t, WithReport(context.Background(), &report), http.MethodGet, "http://missing.invalid/", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorAs(t, err, &dnsErr, "the cause stays visible")
	assert.True(t, dnsErr.IsNotFound)
	assert.EqualValues(t, 1, dials.Load(), "a name that does not exist is looked up once")
	assert.Equal(t, 1, report.Attempts)
	assert.Equal(t, OutcomeTransportError, report.Outcome)
	assert.Zero(t, rec.count(EventRetry))

	// With endpoints: the one whose name does not exist is passed over.
	up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { _, _ = io.WriteString(w, "second") })
	dials.Store(0)
	routed, err := NewTransport(base, Options{
		Retry:     quickRetry(),
		Endpoints: []Endpoint{{URL: "http://missing.invalid"}, {URL: up.URL()}},
	})
	require.NoError(t, err)
	status, body := routedGet(t, routed, "http://orders.invalid/")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "second", body)
	assert.EqualValues(t, 1, dials.Load())
}

// A lookup that timed out may succeed next time: it is retried.
func TestDNSTimeoutRetried(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { _, _ = io.WriteString(w, "ok") })
	var dials atomic.Int64
	var d net.Dialer
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "i/o timeout", Name: "127.0.0.1", IsTimeout: true}}
		}
		return d.DialContext(ctx, network, addr)
	}}
	defer base.CloseIdleConnections()
	tr, err := NewTransport(base, Options{Retry: quickRetry()})
	require.NoError(t, err)
	status, body := routedGet(t, tr, up.URL())
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "ok", body)
	assert.EqualValues(t, 2, dials.Load())
}
