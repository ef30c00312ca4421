package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// What a call tells its observers (events) and its caller (errors).

// ended reports the call's outcome to observers, if any, and to the
// caller's Report, if it asked for one.
func (c *call) ended(start time.Time, resp *http.Response, err error) {
	if c.wantsReport() {
		// One Report covers every RoundTrip made with its context (each hop
		// of the redirects http.Client follows): counts add up, and the
		// fields that name something name this hop's, the last one.
		r := c.over.report
		r.Outcome, r.StatusCode = c.outcome(resp, err)
		r.Attempts += c.attempts
		if c.cfg.route == nil || c.attempts == 0 { // else routeEnded named the answering endpoint
			r.Endpoint = keyOf(c.req.URL).String()
		}
		if c.keyed {
			r.IdempotencyKey = idempotencyKey(c.req.Header, c.cfg.Idempotency.Header)
		}
	}
	if c.cfg.observed() {
		e := Event{Kind: EventCall, Attempt: c.attempts, Duration: time.Since(start), Err: err}
		if resp != nil {
			e.StatusCode = resp.StatusCode
		}
		c.emit(e)
	}
}

// outcome is why the call ended with resp or err, as Report.Outcome says
// it, and resp's status. A response is a failure when the retry layer
// judged it one to retry (retryable), or the server's pushback alone
// stopped a retry of a transient status. An error is classed as ErrorType
// classes it, by the handler's sentinels first; then by the request's own
// context (the caller left); then as the request's own fault, which the
// call's error marks; anything else is the transport's.
func (c *call) outcome(resp *http.Response, err error) (Outcome, int) {
	if err == nil {
		if resp == nil {
			return OutcomeNone, 0 // a base that broke the RoundTripper contract
		}
		if c.retryable {
			return OutcomeFailureStatus, resp.StatusCode
		}
		if _, stop, _ := pushbackOf(resp, c.cfg.Propagation); stop && IsTransient(resp, nil) {
			return OutcomeFailureStatus, resp.StatusCode
		}
		return OutcomeSuccess, resp.StatusCode
	}
	switch {
	case errors.Is(err, ErrCircuitOpen):
		return OutcomeCircuitOpen, 0
	case errors.Is(err, ErrRateLimited):
		return OutcomeRateLimited, 0
	case errors.Is(err, ErrOverloaded):
		return OutcomeOverloaded, 0
	case errors.Is(err, ErrTotalTimeout):
		return OutcomeTotalTimeout, 0
	case errors.Is(err, ErrAttemptTimeout):
		return OutcomeAttemptTimeout, 0
	}
	if left := c.callerLeft(); left != nil {
		if errors.Is(left, context.DeadlineExceeded) {
			return OutcomeDeadlineExceeded, 0
		}
		return OutcomeCanceled, 0
	}
	if ce, ok := err.(*callError); ok && ce.fault {
		return OutcomeRequestFault, 0
	}
	return OutcomeTransportError, 0
}

// wantsReport reports whether the caller asked for a Report of the call.
func (c *call) wantsReport() bool { return c.over != nil && c.over.report != nil }

// rejected is the error of a call the circuit refused, for reason.
func (c *call) rejected(reason error) error {
	c.emit(Event{Kind: EventCircuitRejected, Attempt: c.attempts + 1, Err: reason})
	detail := ""
	if !c.h.isolated.Load() {
		if d := c.s.circuit.RemainingBreak(); d > 0 {
			detail = fmt.Sprintf("for another %v", d.Round(time.Millisecond))
		}
	}
	return c.errorf(ErrCircuitOpen, reason, "%s", detail)
}

func (c *call) totalTimeout(cause error) error {
	if errors.Is(cause, ErrTotalTimeout) {
		cause = nil // the transport handed back our own cause: nothing to add
	}
	c.emit(Event{Kind: EventTotalTimeout, Err: ErrTotalTimeout})
	return c.errorf(ErrTotalTimeout, cause, "of %v", c.totalLimit)
}

// attemptEnded reports attempt n, begun at start after waiting delay, to
// observers: its status, or its error, or the deadline that cut it short.
// From an attempt's own goroutine, rec keeps the event (record).
func (c *call) attemptEnded(n int, start time.Time, delay time.Duration, resp *http.Response, err, deadline error, ep *endpoint, rec *attemptEvents) {
	if !c.cfg.observed() {
		return
	}
	e := Event{Kind: EventAttempt, Attempt: n, Delay: delay, Duration: time.Since(start), Err: err}
	if ep != nil {
		ep.label(&e)
	}
	switch {
	case deadline != nil:
		e.Err = deadline
	case resp != nil:
		e.StatusCode = resp.StatusCode
	}
	c.record(rec, e)
}

// record emits e, an event of the call, or keeps it in rec, when not nil,
// for the call's goroutine to emit: only that goroutine emits the call's
// events and writes its Report (a hedge's goroutine passes its own rec).
func (c *call) record(rec *attemptEvents, e Event) {
	if rec != nil {
		rec.add(e)
		return
	}
	c.emit(e)
}

// emit sends an event about this call. Only the call's own goroutine calls
// it (record).
func (c *call) emit(e Event) {
	if c.wantsReport() {
		c.over.report.note(e)
	}
	if !c.cfg.observed() {
		return
	}
	c.about(&e)
	if e.Attempt == 0 && e.Kind != EventCall {
		e.Attempt = c.attempts
	}
	c.cfg.emit(e)
}

// about fills in the fields by which e names its call: its request, and
// its host unless e names an endpoint's (endpoint.label).
func (c *call) about(e *Event) {
	e.Method, e.Context, e.req = c.req.Method, c.req.Context(), c.req
	if e.Host == "" {
		e.Host = c.s.host
	}
}

func (c *call) errorf(kind, cause error, format string, args ...any) error {
	return &callError{handler: c.cfg.Name, kind: kind, attempts: c.attempts, detail: fmt.Sprintf(format, args...), cause: cause}
}

// faulted is the error of a call that the request's own failure ended:
// its body's reader, a length other than its ContentLength, a request the
// transport refused as malformed (requestFault).
func (c *call) faulted(cause error) error {
	return &callError{handler: c.cfg.Name, attempts: c.attempts, cause: cause, fault: true}
}
