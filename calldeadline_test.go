package resilience

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 8, item 3: a wait that does not fit the caller's own deadline
// (http.Client.Timeout, a context deadline) is not made, as one that does
// not fit TotalTimeout is not: the caller gets the response at once.

func TestCallDeadlineClientTimeoutRetryAfterNotWaited(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("busy"))
	})
	tr, err := NewTransport(&http.Transport{}, Options{})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 500 * time.Millisecond}
	resp, err := client.Get(up.URL())
	require.NoError(t, err, "the 2s Retry-After does not fit the client's 500ms: answer with the 503")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "busy", readBody(t, resp), "untouched")
	assert.EqualValues(t, 1, up.requests.Load())
}

func TestCallDeadlineContextBackoffNotWaited(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	tr, err := NewTransport(&http.Transport{}, Options{Retry: RetryOptions{Delay: time.Second, NoJitter: true}})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	resp, err := tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, up.URL(), nil))
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	readBody(t, resp)
	assert.EqualValues(t, 1, up.requests.Load())
	require.NoError(t, ctx.Err(), "answered at once, not at the deadline")
}

// A wait that fits the caller's deadline is still made.
func TestCallDeadlineWaitThatFitsIsMade(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	tr, err := NewTransport(&http.Transport{}, Options{Retry: quickRetry()})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := client.Get(up.URL())
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	readBody(t, resp)
	assert.EqualValues(t, 2, up.requests.Load())
}
