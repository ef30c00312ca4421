package resiliencetest_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/resiliencetest"
)

// roundTripFunc is a base RoundTripper for tests.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// trackedBody records whether it was closed.
type trackedBody struct {
	io.Reader
	closed bool
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

func get(t *testing.T, ctx context.Context, rt http.RoundTripper) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/x", nil)
	require.NoError(t, err)
	return rt.RoundTrip(req)
}

func TestTransportMakesScriptedResponses(t *testing.T) {
	rt := resiliencetest.NewTransport(nil, resiliencetest.Sequence(
		Fault{Status: 503, RetryAfter: "1", Body: []byte("busy")},
		Fault{},
	))

	resp, err := get(t, context.Background(), rt)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, "503 Service Unavailable", resp.Status)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, "busy", string(body))
	assert.EqualValues(t, 4, resp.ContentLength)
	assert.NotNil(t, resp.Request)

	resp, err = get(t, context.Background(), rt)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode, "no base: a zero Fault is 200 OK")
	assert.Equal(t, http.NoBody, resp.Body)
	assert.Equal(t, 2, rt.Requests())
}

func TestTransportPassesZeroFaultsToBase(t *testing.T) {
	calls := 0
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls++
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	})
	rt := resiliencetest.NewTransport(base, resiliencetest.Sequence(
		Fault{Status: 500}, Fault{Delay: time.Millisecond}, Fault{},
	))
	var codes []int
	for range 3 {
		resp, err := get(t, context.Background(), rt)
		require.NoError(t, err)
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{500, 204, 204}, codes)
	assert.Equal(t, 2, calls, "the 500 is made without the base")
}

func TestTransportReturnsErrorsAndClosesTheBody(t *testing.T) {
	boom := errors.New("boom")
	rt := resiliencetest.NewTransport(nil, resiliencetest.Sequence(Fault{Err: boom}))
	body := &trackedBody{Reader: strings.NewReader("payload")}
	req, err := http.NewRequest(http.MethodPost, "http://upstream.test/", body)
	require.NoError(t, err)
	_, err = rt.RoundTrip(req)
	assert.Same(t, boom, err)
	assert.True(t, body.closed)
}

func TestTransportResetLooksLikeAConnectionReset(t *testing.T) {
	rt := resiliencetest.NewTransport(nil, resiliencetest.Sequence(Fault{Reset: true}))
	_, err := get(t, context.Background(), rt)
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	assert.Equal(t, "read tcp upstream.test:80: read: connection reset by peer", err.Error())

	// Through an http.Client it is a *url.Error like any transport error.
	_, err = (&http.Client{Transport: rt}).Get("https://upstream.test/")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Contains(t, err.Error(), "upstream.test:443")
}

func TestTransportHangHonoursTheContext(t *testing.T) {
	rt := resiliencetest.NewTransport(nil, resiliencetest.Sequence(Fault{Hang: true}))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := get(t, ctx, rt)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := get(t, ctx, rt)
		done <- err
	}()
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

func TestTransportDelayHonoursTheContext(t *testing.T) {
	rt := resiliencetest.NewTransport(nil, resiliencetest.Sequence(
		Fault{Delay: 10 * time.Millisecond, Status: 202},
		Fault{Delay: time.Hour},
	))
	start := time.Now()
	resp, err := get(t, context.Background(), rt)
	require.NoError(t, err)
	assert.Equal(t, 202, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 10*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = get(t, ctx, rt)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestTransportForwardsCloseIdleConnections(t *testing.T) {
	base := &http.Transport{}
	rt := resiliencetest.NewTransport(base, nil)
	rt.CloseIdleConnections() // does not panic; nothing idle
	resiliencetest.NewTransport(nil, nil).CloseIdleConnections()
}
