package resilience

//lint:file-ignore SA1019 Request.Cancel is deprecated, but http.Client still closes it for a RoundTripper it does not know, so the handler honours it (callerLeft)

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/httpbody"
)

// A call is one request's way through the handler's stack (standard.go):
// what it was sent with, what its attempts came to, and its deadlines. Only
// the goroutine that runs RoundTrip writes it, until the response is
// delivered; its response body, when returned, is the call itself
// (body.go), so that the end of the body ends the call. Its attempts are
// values of their own (attempt.go), sent by the retry loop (retry.go) or the
// hedging race (hedge.go). Its size is held to one allocation size class
// (callsize_test.go).
type call struct {
	h    *Handler
	cfg  *config // the options the call started under, for its whole life
	s    *hostState
	base http.RoundTripper
	req  *http.Request
	over *overrides // the request's overrides, if any
	body httpbody.Replay

	attemptLimit time.Duration // the attempt timeout; 0 for none
	totalLimit   time.Duration // the total timeout; 0 for none
	permit       *policies     // those whose bulkhead the call holds a permit of, if any (admission.go)

	attempts   int32 // attempts sent so far
	repeatable bool  // the request may be sent more than once
	keyed      bool  // the request carries an idempotency key its upstream keeps
	retryable  bool  // the last attempt failed in a way the retry layer retries
	quotaTaken bool  // admission took the call's share of the server's quota (serverquota.go)

	deadlines // the call's own, its sequential attempts' and its body's (deadline.go)
	delivery

	// first is the first sequential attempt's request, in the call's
	// allocation rather than one of its own (attempt.request).
	first observedRequest
}

// delivery is the state of the response handed to the caller, whose body is
// the call itself: the end of the body ends the call.
type delivery struct {
	flags atomic.Uint32 // the delivery flags below, each set once
	rc    io.ReadCloser // the returned response's body
}

// The delivery's flags, in one word: three atomic.Bools took 8 bytes more,
// which pushed the call past its size class (callsize_test.go).
const (
	deliveryDone         uint32 = 1 << iota // the call has ended
	deliveryReported                        // the total timeout while reading the body was emitted
	deliveryClosed                          // rc has been closed
	deliveryEOF                             // the caller read rc to its end: further reads say io.EOF again
	deliveryCallerClosed                    // the caller closed the body: reads say what rc says once closed
)

// set sets flag f, and reports whether it was set already.
func (d *delivery) set(f uint32) (was bool) { return d.flags.Or(f)&f != 0 }

// is reports whether flag f is set.
func (d *delivery) is(f uint32) bool { return d.flags.Load()&f != 0 }

// errRequestCanceled is why a call ends when the caller closes the
// request's Cancel channel, as http.Client does for its Timeout with a
// RoundTripper it does not know.
var errRequestCanceled = errors.New("resilience: request canceled")

// callerLeft returns the caller's reason to stop waiting for the call, if
// it has one: the request context's error, or its Cancel channel closed.
// Whatever else fails an attempt, a timeout included, is the attempt's.
func (c *call) callerLeft() error {
	if err := c.req.Context().Err(); err != nil {
		return err
	}
	if c.req.Cancel != nil {
		select {
		case <-c.req.Cancel:
			return errRequestCanceled
		default:
		}
	}
	return nil
}

// sleepUntil waits until t, and returns the caller's reason to stop if it
// leaves first (callerLeft).
func (c *call) sleepUntil(t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return c.callerLeft()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-c.req.Context().Done():
		return c.req.Context().Err()
	case <-c.req.Cancel: // nil, and so never ready, unless the caller set it
		return errRequestCanceled
	}
}

// Per-request overrides travel in the request's context, so that one call
// can differ from its handler's options without another handler. The .NET
// handler has no such thing (dotnet/extensions#5048).

// overrides is what a request's context changes; one context value holds
// all of them, so a request costs one lookup whatever it overrides.
type overrides struct {
	retryable  int8 // 0: the method rule; 1: repeatable; -1: not
	attempt    time.Duration
	total      time.Duration
	hasAttempt bool
	hasTotal   bool
	report     *Report // filled in when the call returns
}

type overridesKey struct{}

// hasBody reports whether the caller's request has a body: one to send,
// and to close if no attempt sends it (closeBody). A request without one
// needs none of httpbody.Replay's bookkeeping.
func (c *call) hasBody() bool { return c.req.Body != nil && c.req.Body != http.NoBody }

// closeBody closes the caller's request body if no attempt took it:
// RoundTrip closes it even when it sends nothing.
func (c *call) closeBody() {
	if c.hasBody() {
		c.body.Close()
	}
}

// wantsReport reports whether the caller asked for a Report of the call.
func (c *call) wantsReport() bool { return c.over != nil && c.over.report != nil }

// heard reports whether anyone hears how the call went: the observers of
// its options or a Report its caller asked for. A call nobody hears builds
// no event and fills in no Report (event.go).
func (c *call) heard() bool { return c.cfg.observed || c.wantsReport() }

func overridesFrom(ctx context.Context) *overrides {
	o, _ := ctx.Value(overridesKey{}).(*overrides)
	return o
}

func withOverride(ctx context.Context, set func(*overrides)) context.Context {
	var o overrides
	if prev := overridesFrom(ctx); prev != nil {
		o = *prev
	}
	set(&o)
	return context.WithValue(ctx, overridesKey{}, &o)
}

// WithRetryable returns a context whose requests are safe to repeat
// whatever their method, or, if retryable is false, never.
func WithRetryable(ctx context.Context, retryable bool) context.Context {
	return withOverride(ctx, func(o *overrides) {
		o.retryable = -1
		if retryable {
			o.retryable = 1
		}
	})
}

// WithAttemptTimeout returns a context whose requests have d as their
// attempt timeout instead of AttemptTimeout, strict as with
// StrictAttemptTimeout; a negative d turns it off. Where TotalTimeout is a
// default, their total timeout is at least 3 × d, as an
// Options.AttemptTimeout of d would make it; an explicit TotalTimeout, or
// WithTotalTimeout, still bounds their attempts.
func WithAttemptTimeout(ctx context.Context, d time.Duration) context.Context {
	return withOverride(ctx, func(o *overrides) { o.attempt, o.hasAttempt = d, true })
}

// WithTotalTimeout returns a context whose requests have d as their total
// timeout instead of TotalTimeout; a negative d turns it off.
func WithTotalTimeout(ctx context.Context, d time.Duration) context.Context {
	return withOverride(ctx, func(o *overrides) { o.total, o.hasTotal = d, true })
}
