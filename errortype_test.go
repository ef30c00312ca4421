package resilience

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// errorTypeOf is the ErrorType of the error RoundTrip returned.
func errorTypeOf(t *testing.T, err error) string {
	t.Helper()
	var et interface{ ErrorType() string }
	require.ErrorAs(t, err, &et)
	return et.ErrorType()
}

// Issue 47, item 11: when the caller leaves just as the last attempt fails
// with a transport error, Report.Outcome and the error's ErrorType name the
// same class: the caller's, as the call's error says (errors.Is finds the
// context's error; errors.As still finds the attempt's). The base here
// ends the caller's context, then fails the attempt: the race that a soak
// met about once in 60,000 calls, made certain.
func TestOutcomeAgreesWithErrorTypeWhenCallerLeavesAsLastAttemptFails(t *testing.T) {
	reset := func() error {
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	}
	for _, tc := range []struct {
		name     string
		retry    RetryOptions
		attempts int
	}{
		{"no retries", RetryOptions{Disabled: true}, 1},
		{"the last of three", RetryOptions{MaxRetries: 2, Delay: time.Millisecond, MaxDelay: time.Millisecond, NoJitter: true}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var n atomic.Int32
			base := roundTripFunc(func(*http.Request) (*http.Response, error) {
				if int(n.Add(1)) == tc.attempts {
					cancel() // the caller leaves...
				}
				return nil, reset() // ...as the attempt fails on its own
			})
			rec := &evRecorder{measures: true}
			tr, err := NewTransport(base, Options{Retry: tc.retry, OnEvent: rec.add})
			require.NoError(t, err)
			var report Report
			req := newTestRequest(t, WithReport(ctx, &report), http.MethodGet, "http://upstream.invalid/", nil)
			_, err = tr.RoundTrip(req)
			require.Error(t, err)
			assert.Equal(t, tc.attempts, report.Attempts)
			assert.Equal(t, report.Outcome.String(), errorTypeOf(t, err), "Outcome and ErrorType agree: %v", err)
			assert.Equal(t, OutcomeCanceled, report.Outcome)
			assert.ErrorIs(t, err, context.Canceled)
			var oe *net.OpError
			assert.ErrorAs(t, err, &oe, "the attempt's failure stays visible")
			calls := rec.of(EventCall)
			require.Len(t, calls, 1)
			assert.Equal(t, "canceled", errorTypeOf(t, calls[0].Err), "the call's event says the same")
		})
	}
}

// The same for the caller's deadline, passed while the attempt was under
// way, when the base answers it with an error of its own rather than the
// context's.
func TestOutcomeAgreesWithErrorTypeWhenCallerDeadlinePasses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	})
	tr, err := NewTransport(base, Options{})
	require.NoError(t, err)
	var report Report
	_, err = tr.RoundTrip(newTestRequest(t, WithReport(ctx, &report), http.MethodGet, "http://upstream.invalid/", nil))
	require.Error(t, err)
	assert.Equal(t, report.Outcome.String(), errorTypeOf(t, err), "Outcome and ErrorType agree: %v", err)
	assert.Equal(t, OutcomeDeadlineExceeded, report.Outcome)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "the caller's deadline is a timeout, as http.Client's are")
}

// The base transport's own timeouts say errors.Is(err,
// context.DeadlineExceeded), but they are the attempt's, not the caller's
// deadline: Outcome says transport_error, and ErrorType "timeout", not
// "deadline_exceeded". A dial past its deadline (net's own error) and
// ResponseHeaderTimeout (net/http's), against a real server that never
// answers.
func TestOutcomeAgreesWithErrorTypeOnBaseTimeouts(t *testing.T) {
	up := newTestUpstream(t, func(_ http.ResponseWriter, r *http.Request, _ int) {
		<-r.Context().Done()
	})
	dialLate := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Deadline: time.Now().Add(-time.Second)} // already past
		return d.DialContext(ctx, network, addr)
	}}
	noHeaders := &http.Transport{ResponseHeaderTimeout: time.Millisecond}
	for _, tc := range []struct {
		name string
		base *http.Transport
	}{{"dial timeout", dialLate}, {"ResponseHeaderTimeout", noHeaders}} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.base.CloseIdleConnections()
			_, bare := tc.base.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
			require.ErrorIs(t, bare, context.DeadlineExceeded, "what net and net/http say of their timeouts")

			tr, err := NewTransport(tc.base, Options{Retry: RetryOptions{Disabled: true}})
			require.NoError(t, err)
			var report Report
			_, err = tr.RoundTrip(newTestRequest(t, WithReport(context.Background(), &report), http.MethodGet, up.URL(), nil))
			require.Error(t, err)
			assert.Equal(t, OutcomeTransportError, report.Outcome)
			assert.Equal(t, "timeout", errorTypeOf(t, err), "%v", err)
			assert.ErrorIs(t, err, context.DeadlineExceeded, "errors.Is says what it said bare")
		})
	}
}
