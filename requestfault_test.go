package resilience

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 8, item 5: a failure of the request itself is the caller's. It is
// not retried, and neither the circuit breaker nor the retry budget counts
// it against a healthy upstream.

// faultOptions opens the circuit on two failed attempts out of two.
func faultOptions() Options {
	return Options{
		Retry:          RetryOptions{Methods: []string{http.MethodPut}, Delay: time.Millisecond, NoJitter: true},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 2, SamplingDuration: time.Minute},
	}
}

func TestRequestFaultBodyReaderNotChargedToUpstream(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	h, err := NewHandler(faultOptions())
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := h.Transport(base)

	readErr := errors.New("disk read failed")
	for i := 0; i < 2; i++ {
		// A POST is streamed once, so its body is read by the transport.
		req, err := http.NewRequest(http.MethodPost, up.URL(), io.NopCloser(&failingReader{data: "abc", err: readErr}))
		require.NoError(t, err)
		_, err = tr.RoundTrip(req)
		require.ErrorIs(t, err, readErr)
	}
	assert.Equal(t, CircuitClosed, h.CircuitState(), "two local read failures opened the circuit of a healthy upstream")
	assert.Zero(t, h.shared.breaker().Metrics().Executions())
	assert.Equal(t, float64(defaultBudgetTokens), h.budget.Level())

	resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
	require.NoError(t, err)
	readBody(t, resp)
}

func TestRequestFaultReplayedBodyReaderNotRetried(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	h, err := NewHandler(faultOptions())
	require.NoError(t, err)
	counter := &testAttemptCounter{base: &http.Transport{}}
	defer counter.CloseIdleConnections()
	tr := h.Transport(counter)

	readErr := errors.New("disk read failed")
	req, err := http.NewRequest(http.MethodPut, up.URL(), strings.NewReader("abc"))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(&failingReader{data: "abc", err: readErr}), nil
	}
	req.Body, _ = req.GetBody()
	req.ContentLength = -1
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, readErr)
	assert.EqualValues(t, 1, counter.n.Load(), "the request's own failure is not retried")
	assert.Zero(t, h.shared.breaker().Metrics().Executions())
}

func TestRequestFaultContentLengthMismatchNotRetried(t *testing.T) {
	// The upstream never answers: an answer to the first 3 bytes could
	// reach the transport before its own write error does (net/http returns
	// whichever comes first), and the call would then succeed by chance.
	var up *testUpstream
	up = newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { up.hang(r) })
	for _, length := range []int64{10, 3} {
		h, err := NewHandler(faultOptions())
		require.NoError(t, err)
		counter := &testAttemptCounter{base: &http.Transport{}}
		tr := h.Transport(counter)
		req, err := http.NewRequest(http.MethodPut, up.URL(), strings.NewReader("hello"))
		require.NoError(t, err)
		req.ContentLength = length
		_, err = tr.RoundTrip(req)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "ContentLength")
		assert.EqualValues(t, 1, counter.n.Load(), "ContentLength %d: a body that does not match its length is not retried", length)
		assert.Zero(t, h.shared.breaker().Metrics().Executions())
		assert.Equal(t, float64(defaultBudgetTokens), h.budget.Level())
		counter.CloseIdleConnections()
	}
}

// Issue 8, item 6: net/http quotes the upstream's bad header line in its
// error; that text must not make a failed attempt look like a malformed
// request of ours.
func TestRequestFaultUpstreamTextDoesNotSteerClassification(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	requests := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				mu.Lock()
				requests++
				mu.Unlock()
				_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\ninvalid header field\r\nContent-Length: 0\r\n\r\n")
			}()
		}
	}()
	defer wg.Wait()
	defer ln.Close()

	opts := faultOptions()
	opts.Retry.MaxRetries = 2
	opts.CircuitBreaker.MinimumThroughput = 100
	h, err := NewHandler(opts)
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	_, err = h.Transport(base).RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, "http://"+ln.Addr().String(), nil))
	require.Error(t, err)
	mu.Lock()
	assert.Equal(t, 3, requests, "a broken response is a transient failure: retried")
	mu.Unlock()
	assert.EqualValues(t, 3, h.shared.breaker().Metrics().Failures(), "and counted by the breaker")
}

func TestIsRequestErrorByPrefixOnly(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errors.New(`net/http: invalid header field name "a b"`), true},
		{errors.New(`unsupported protocol scheme "ftp"`), true},
		{errors.New("http: ContentLength=10 with Body length 5"), true},
		{errors.New("http2: request body larger than specified content length"), true},
		{errors.New("malformed MIME header line: invalid header field"), false},
		{errors.New(`net/http: HTTP/1.x transport connection broken: malformed HTTP response "no Host in request URL"`), false},
		{&urlError{errors.New("http: no Host in request URL")}, true},
	} {
		assert.Equal(t, tc.want, isRequestError(tc.err), "%v", tc.err)
	}
}

// urlError wraps like *url.Error, whose own message starts with the URL.
type urlError struct{ err error }

func (e *urlError) Error() string {
	return `Get "http://x/?q=unsupported protocol scheme": ` + e.err.Error()
}
func (e *urlError) Unwrap() error { return e.err }
