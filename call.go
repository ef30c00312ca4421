package resilience

//lint:file-ignore SA1019 Request.Cancel is deprecated, but http.Client still closes it for a RoundTripper it does not know, so the handler honours it (callerLeft)

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/resilienthttp/resilience/internal/httpbody"
)

// A call is one request's way through the handler's stack (standard.go):
// what it was sent with, and one part per job, declared here and worked by
// the file named beside it. Its response body, when returned, is the call
// itself, so that the end of the body ends the call. Its size is held to
// one allocation size class (callsize_test.go).
type call struct {
	h    *Handler
	cfg  *config // the options the call started under, for its whole life
	s    *hostState
	base http.RoundTripper
	req  *http.Request
	over *overrides // the request's overrides, if any
	body httpbody.Replay

	admission // admission.go
	retrying  // retry.go
	deadlines // deadline.go
	delivery  // delivery.go
}

// retrying is the retry loop's state (retry.go).
type retrying struct {
	attempts   int  // attempts sent so far
	repeatable bool // the request may be sent more than once
	keyed      bool // the request carries an idempotency key its upstream keeps
	retryable  bool // the last attempt failed in a way the retry layer retries
	prepared   bool // body.prepare has run
	quotaTaken bool // admission took the call's share of the server's quota (admission.go)
	// firstDelivery says that the next attempt is a failover after attempts
	// whose request never left the client (retry.go): the retry budget
	// counts it as a first attempt, and it claimed no token.
	firstDelivery bool
	delays        backoff.BackOff
}

// admission is a call's hold on its host's concurrency limit.
type admission struct {
	permit *policies // those whose bulkhead the call holds a permit of, if any
	// quotaTaken, set when the call took its share of the quota its
	// upstream announced (serverquota.go), is kept in retrying's padding:
	// here it would move every call to the next allocation size class.
}

// deadlines is a call's side of its deadlines: the limits, the timer, and
// the current attempt's context. mu guards the fields below it, and the
// delivery's done and reported.
type deadlines struct {
	attemptLimit time.Duration // the attempt timeout; 0 for none
	totalLimit   time.Duration // the total timeout; 0 for none
	totalAt      time.Time     // zero without a total timeout

	mu         sync.Mutex
	timer      *timerSlot
	armedAt    time.Time
	armedCause error                   // what the timer cancels with; nil when disarmed
	cancel     context.CancelCauseFunc // the current attempt's
	fired      error                   // the cause the timer cancelled the current attempt with
	inBody     bool                    // the current attempt's headers arrived in time
}

// delivery is the state of the response handed to the caller, whose body is
// the call itself: the end of the body ends the call.
type delivery struct {
	done      bool          // the call has ended; guarded by mu
	reported  bool          // the total timeout while reading the body was emitted; guarded by mu
	delivered bool          // the body is the caller's, so the total timeout ends the call; guarded by mu
	rcClosed  atomic.Bool   // rc has been closed
	rc        io.ReadCloser // the returned response's body
}

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
