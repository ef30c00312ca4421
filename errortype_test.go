package resilience

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// classedError has an ErrorType of its own, as a nested handler's error
// has.
type classedError struct{}

func (classedError) Error() string     { return "classed" }
func (classedError) ErrorType() string { return "classed" }

type netTimeout struct{}

func (netTimeout) Error() string   { return "i/o timeout" }
func (netTimeout) Timeout() bool   { return true }
func (netTimeout) Temporary() bool { return true }

// The error RoundTrip returns names its class for OpenTelemetry's
// error.type, which otelhttp reads through an ErrorType method: the
// handler's own failures by a short name, a cause by its type without the
// wrappers and the pointer's "*".
func TestCallErrorType(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  *callError
		want string
	}{
		{&callError{kind: ErrCircuitOpen, cause: ErrIsolated}, "circuit_open"},
		{&callError{kind: ErrCircuitOpen, cause: refused}, "circuit_open"},
		{&callError{cause: &RateLimitError{Limit: "local"}}, "rate_limited"},
		{&callError{cause: &OverloadError{Limit: 1}}, "overloaded"},
		{&callError{kind: ErrTotalTimeout}, "total_timeout"},
		{&callError{kind: ErrTotalTimeout, cause: context.DeadlineExceeded}, "total_timeout"},
		{&callError{kind: ErrAttemptTimeout}, "attempt_timeout"},
		{&callError{cause: context.Canceled}, "canceled"},
		{&callError{cause: errRequestCanceled}, "canceled"},
		{&callError{cause: context.DeadlineExceeded}, "deadline_exceeded"},
		{&callError{cause: fmt.Errorf("reading: %w", classedError{})}, "classed"},
		{&callError{cause: &callError{kind: ErrCircuitOpen}}, "circuit_open"}, // a nested handler's
		{&callError{cause: &net.OpError{Op: "dial", Err: netTimeout{}}}, "timeout"},
		{&callError{cause: refused}, "net.OpError"},
		{&callError{cause: &url.Error{Op: "Get", URL: "http://h/", Err: refused}}, "net.OpError"},
		{&callError{cause: fmt.Errorf("request body: %w", errShortBody)}, "errors.errorString"},
		{&callError{cause: syscall.ECONNRESET}, "syscall.Errno"},
		{&callError{detail: "nothing else"}, "_OTHER"},
	} {
		assert.Equal(t, tc.want, tc.err.ErrorType(), "%v", tc.err)
	}
}

var errShortBody = errors.New("unexpected EOF")

// Through RoundTrip: the circuit isolated, and a refused dial, each with
// errors.Is and errors.As as before.
func TestCallErrorTypeFromRoundTrip(t *testing.T) {
	type errorTyper interface{ ErrorType() string }
	up := newTestUpstream(t, func(http.ResponseWriter, *http.Request, int) {})
	h, err := NewHandler(Options{Name: "typed", Retry: RetryOptions{Disabled: true}})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	h.IsolateCircuit()
	req, err := http.NewRequest(http.MethodGet, up.URL(), nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, ErrCircuitOpen)
	var et errorTyper
	require.ErrorAs(t, err, &et)
	assert.Equal(t, "circuit_open", et.ErrorType())
	h.CloseCircuit()

	closed := newTestUpstream(t, func(http.ResponseWriter, *http.Request, int) {})
	addr := closed.URL()
	closed.srv.Close()
	req, err = http.NewRequest(http.MethodGet, addr, nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.ErrorAs(t, err, &et)
	assert.Equal(t, "net.OpError", et.ErrorType())
}
