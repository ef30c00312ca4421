package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/failsafe-go/failsafe-go/bulkhead"
)

// The standard stack, outermost first: admission (concurrency and rate),
// total deadline, retry (or hedging, in hedge.go), circuit breaker, attempt
// deadline (enforced in deadline.go). One call is one *call; its response
// body, when returned, is the call itself, so that the permit and the timer
// are released when the body is closed or read to EOF.

type call struct {
	h    *Handler
	s    *hostState
	base http.RoundTripper
	req  *http.Request
	body requestBody

	attempts     int
	attemptLimit time.Duration // the attempt timeout; 0 for none
	totalLimit   time.Duration // the total timeout; 0 for none
	over         *overrides    // the request's overrides, if any
	repeatable   bool          // the request may be sent more than once
	retryable    bool          // the last attempt failed in a way the retry layer retries
	prepared     bool          // body.prepare has run
	totalAt      time.Time     // zero without a total timeout
	permit       bool          // holds a bulkhead permit
	queued       bool          // waited in the admission queue
	delays       backoff.BackOff

	mu         sync.Mutex
	timer      *timerSlot
	armedAt    time.Time
	armedCause error                   // what the timer cancels with; nil when disarmed
	cancel     context.CancelCauseFunc // the current attempt's
	fired      error                   // the cause the timer cancelled the current attempt with
	inBody     bool                    // the current attempt's headers arrived in time
	done       bool
	reported   bool          // the total timeout while reading the body was emitted
	rc         io.ReadCloser // the returned response's body
	rcClosed   atomic.Bool   // rc has been closed
}

// errDrainTimeout cuts short the draining of a retried response.
var errDrainTimeout = errors.New("resilience: drain timeout")

func (h *Handler) roundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("resilience: handler %q: nil Request.URL", h.cfg.Name)
	}
	c := &call{h: h, s: h.stateFor(req), base: base, req: req}
	c.body.orig = req.Body // closed at the end if no attempt sends it
	c.attemptLimit, c.totalLimit = max(0, h.cfg.AttemptTimeout), max(0, h.cfg.TotalTimeout)
	if o := overridesFrom(req.Context()); o != nil {
		c.over = o
		if o.hasAttempt {
			c.attemptLimit = max(0, o.attempt)
		}
		if o.hasTotal {
			c.totalLimit = max(0, o.total)
		}
	}
	now := time.Now()
	if c.totalLimit > 0 {
		c.totalAt = now.Add(c.totalLimit)
	}
	if err := c.admit(); err != nil {
		c.body.close()
		c.ended(now, nil, err)
		c.finish()
		return nil, err
	}
	var resp *http.Response
	var err error
	if h.cfg.Hedging.Enabled {
		resp, err = c.hedge(now)
	} else {
		resp, err = c.run(now)
	}
	c.body.close()
	c.ended(now, resp, err)
	if err != nil {
		c.finish()
		return nil, err
	}
	c.deliver(resp)
	return resp, nil
}

// ended reports the call's outcome to observers, if any.
func (c *call) ended(start time.Time, resp *http.Response, err error) {
	if c.h.observed() {
		e := Event{Kind: EventCall, Attempt: c.attempts, Duration: time.Since(start), Err: err}
		if resp != nil {
			e.StatusCode = resp.StatusCode
		}
		c.emit(e)
	}
}

// admit takes a concurrency permit, waiting in the queue if there is room
// there, and a rate permit.
func (c *call) admit() error {
	h, s := c.h, c.s
	if s.bulkhead != nil {
		if !s.bulkhead.TryAcquirePermit() {
			if err := c.queue(); err != nil {
				return err
			}
		}
		c.permit = true
	}
	if s.limiter != nil && !s.limiter.TryAcquirePermit() {
		c.releasePermit()
		c.emit(Event{Kind: EventRateLimited})
		return c.errorf(ErrRateLimited, nil, "over %g requests per second", h.cfg.RateLimit.RequestsPerSecond)
	}
	return nil
}

func (c *call) queue() error {
	h, s := c.h, c.s
	reject := func(detail string, cause error) error {
		c.emit(Event{Kind: EventRateLimited, Err: cause})
		return c.errorf(ErrRateLimited, cause, "%s", detail)
	}
	max := int64(h.cfg.RateLimit.MaxQueue)
	defer s.queued.Add(-1)
	if s.queued.Add(1) > max {
		return reject(fmt.Sprintf("%d calls in flight and %d queued", h.cfg.RateLimit.MaxConcurrent, max), nil)
	}
	var err error
	if c.totalAt.IsZero() {
		err = s.bulkhead.AcquirePermit(c.req.Context())
	} else {
		err = s.bulkhead.AcquirePermitWithMaxWait(c.req.Context(), time.Until(c.totalAt))
	}
	switch {
	case err == nil:
		c.queued = true
		return nil
	case errors.Is(err, bulkhead.ErrFull):
		return reject("queued for admission until the total timeout", ErrTotalTimeout)
	}
	return c.errorf(nil, err, "queued for admission")
}

// run is the retry loop. It returns the response to give the caller, or
// the error.
func (c *call) run(now time.Time) (*http.Response, error) {
	cfg := c.h.cfg
	c.repeatable = !cfg.Retry.Disabled && cfg.methods.repeatable(c.req, c.over)
	for n := 1; ; n++ {
		if n > 1 || c.queued {
			now = time.Now()
		}
		resp, err, final := c.attempt(now)
		if final {
			return nil, err // rejected, total timeout, cancelled, the request's own failure
		}
		if !c.repeatable || n > cfg.Retry.MaxRetries || !c.body.replayable() || !c.retryable {
			return c.result(resp, err)
		}
		wait, ok := c.nextDelay(resp)
		if !ok {
			return c.result(resp, err) // the wait asked for does not fit: answer now
		}
		if b := c.h.budget; b != nil && !b.allow() {
			e := Event{Kind: EventBudgetExceeded, Attempt: n, Err: b.refusal(err)}
			if resp != nil {
				e.StatusCode = resp.StatusCode
			}
			c.emit(e)
			return c.result(resp, err)
		}
		wakeAt := time.Now().Add(wait)
		if c.h.observed() {
			e := Event{Kind: EventRetry, Attempt: n, Delay: wait, Err: err}
			if resp != nil {
				e.StatusCode = resp.StatusCode
			}
			c.emit(e)
		}
		if resp != nil {
			c.discard(resp)
		}
		if err := c.sleepUntil(wakeAt); err != nil {
			return nil, c.errorf(nil, err, "waiting to retry")
		}
	}
}

// result is what the caller gets when retries stop on an attempt's outcome.
func (c *call) result(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	if errors.Is(err, ErrAttemptTimeout) {
		return nil, c.errorf(ErrAttemptTimeout, nil, "of %v", c.attemptLimit)
	}
	return nil, c.errorf(nil, err, "")
}

// nextDelay returns how long to wait before the next attempt, and false
// when that wait is not worth making: a Retry-After beyond MaxRetryAfter,
// or any wait that would end past the call's deadline, the earlier of the
// total timeout and the request context's own deadline (http.Client.Timeout
// is one).
func (c *call) nextDelay(resp *http.Response) (time.Duration, bool) {
	r := c.h.cfg.Retry
	if c.delays == nil {
		c.delays = newBackOff(r)
	}
	wait := min(c.delays.NextBackOff(), r.MaxDelay)
	now := time.Now()
	if !r.IgnoreRetryAfter {
		if d, ok := retryAfter(resp, now); ok {
			if r.MaxRetryAfter > 0 && d > r.MaxRetryAfter {
				return 0, false
			}
			wait = d
		}
	}
	deadline := c.totalAt
	if d, ok := c.req.Context().Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if !deadline.IsZero() && !now.Add(wait).Before(deadline) {
		return 0, false
	}
	return wait, true
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

// attempt sends one attempt through the circuit breaker under the attempt
// deadline. When final is true the call is over and err says why; otherwise
// the outcome is the attempt's, for the retry layer to judge.
func (c *call) attempt(now time.Time) (resp *http.Response, err error, final bool) {
	h := c.h
	if err := c.callerLeft(); err != nil {
		return nil, c.errorf(nil, err, ""), true // the caller left: say so, not what the circuit would have said
	}
	if !c.totalAt.IsZero() && !now.Before(c.totalAt) {
		return nil, c.totalTimeout(nil), true
	}
	if h.isolated.Load() {
		return nil, c.rejected(ErrIsolated), true
	}
	probe, err := c.s.admit()
	if err != nil {
		return nil, c.rejected(err), true
	}
	if !c.prepared {
		// Only now, once the call will be sent, is the body read ahead.
		c.prepared = true
		if err := c.body.prepare(c.req, c.repeatable, h.cfg.MaxBufferedBody); err != nil {
			c.s.releaseProbe(probe) // the request's own failure
			return nil, c.errorf(nil, err, ""), true
		}
	}
	body, getBody, err := c.body.next()
	if err != nil {
		c.s.releaseProbe(probe)
		return nil, c.errorf(nil, err, ""), true
	}

	ctx, cancel := context.WithCancelCause(c.req.Context())
	r, sent := c.attemptRequest(ctx, body, getBody)
	c.attempts++
	c.start(cancel, now)
	resp, err = c.base.RoundTrip(r)
	fired := c.headers()
	c.attemptEnded(c.attempts, now, resp, err, fired)

	switch {
	case fired == ErrTotalTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		c.s.abandonProbe(probe, ErrTotalTimeout)
		return nil, c.totalTimeout(err), true
	case fired == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		resp, err = nil, ErrAttemptTimeout
		c.emit(Event{Kind: EventAttemptTimeout, Err: err})
	case err != nil && c.callerLeft() != nil:
		c.s.abandonProbe(probe, err)
		return nil, c.errorf(nil, err, ""), true
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			c.s.releaseProbe(probe) // says nothing about the upstream
			return nil, c.errorf(nil, fault, ""), true
		}
	}
	c.retryable = c.judge(c.attempts == 1, resp, err)
	return resp, err, false
}

// requestFault returns the failure of the request itself behind err, the
// error of an attempt that sent body: its body's reader failed, its body
// did not match its ContentLength, or the transport refused it as
// malformed. Such a failure is the caller's: it is not retried, and neither
// the circuit breaker nor the retry budget counts it.
func requestFault(body *sentBody, err error) error {
	if isRequestError(err) {
		return err
	}
	if fault := body.fault(); fault != nil {
		if errors.Is(err, errors.Unwrap(fault)) {
			return err // the transport returned the reader's error itself
		}
		return fmt.Errorf("%w (%v)", fault, err)
	}
	return nil
}

// judge tells the circuit breaker and the retry budget how an attempt went
// (the first of its call, or a later one), and reports whether it is a
// failure the retry layer would retry. The standard classification
// (IsTransient) is computed once for all three.
func (c *call) judge(first bool, resp *http.Response, err error) (retryable bool) {
	cfg := c.h.cfg
	var transient bool
	if cfg.Retry.ShouldRetry == nil || cfg.CircuitBreaker.ShouldHandle == nil {
		transient = IsTransient(resp, err)
	}
	retryable = transient
	if f := cfg.Retry.ShouldRetry; f != nil {
		retryable = f(resp, err)
	}
	if b := c.s.breaker; b != nil {
		failed := transient
		if f := cfg.CircuitBreaker.ShouldHandle; f != nil {
			failed = f(resp, err)
		}
		if failed {
			c.s.failures.record(resp, err)
			b.RecordFailure()
		} else {
			b.RecordSuccess()
		}
	}
	if b := c.h.budget; b != nil {
		b.record(first, retryable)
	}
	return retryable
}

// rejected is the error of a call the circuit refused, for reason.
func (c *call) rejected(reason error) error {
	c.emit(Event{Kind: EventCircuitRejected, Attempt: c.attempts + 1, Err: reason})
	detail := ""
	if c.s.breaker != nil && !c.h.isolated.Load() {
		if d := c.s.breaker.RemainingDelay(); d > 0 {
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

// attemptEnded reports attempt n, begun at start, to observers: its status,
// or its error, or the deadline that cut it short.
func (c *call) attemptEnded(n int, start time.Time, resp *http.Response, err, deadline error) {
	if !c.h.observed() {
		return
	}
	e := Event{Kind: EventAttempt, Attempt: n, Duration: time.Since(start), Err: err}
	switch {
	case deadline != nil:
		e.Err = deadline
	case resp != nil:
		e.StatusCode = resp.StatusCode
	}
	c.emit(e)
}

// emit sends an event about this call.
func (c *call) emit(e Event) {
	if !c.h.observed() {
		return
	}
	e.Method, e.Host = c.req.Method, c.s.host
	if e.Attempt == 0 && e.Kind != EventCall {
		e.Attempt = c.attempts
	}
	c.h.emit(e)
}

func (c *call) errorf(kind, cause error, format string, args ...any) error {
	return &callError{handler: c.h.cfg.Name, kind: kind, attempts: c.attempts, detail: fmt.Sprintf(format, args...), cause: cause}
}

// discard drains and closes a response that is retried, bounded in bytes
// and time, and releases its attempt.
func (c *call) discard(resp *http.Response) {
	c.mu.Lock()
	now := time.Now()
	at, cause := now.Add(maxDrainTime), errDrainTimeout
	if !c.totalAt.IsZero() && c.totalAt.Before(at) {
		at, cause = c.totalAt, ErrTotalTimeout
	}
	c.armLocked(at, cause, now)
	c.mu.Unlock()
	drain(resp)
	c.mu.Lock()
	c.armLocked(time.Time{}, nil, now)
	cancel := c.cancel
	c.cancel = nil
	c.mu.Unlock()
	cancel(nil)
}

// deliver hands resp to the caller, its body wrapped so that the end of the
// body ends the call.
func (c *call) deliver(resp *http.Response) {
	resp.Request = c.req
	switch {
	case resp.Body == nil || resp.Body == http.NoBody:
		c.finish()
	case resp.StatusCode == http.StatusSwitchingProtocols:
		// The body is the upgraded connection: no deadline applies to it
		// and no permit is held for it, but its context lives until Close.
		c.mu.Lock()
		c.releaseTimerLocked()
		c.mu.Unlock()
		c.releasePermit()
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = upgraded{rwc, c}
		}
	default:
		c.rc = resp.Body
		resp.Body = c
	}
}

// Read reads the response body, ending the call at EOF or on an error.
func (c *call) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	if err != nil {
		if err != io.EOF {
			err = c.bodyError(err)
		}
		// Close before finish releases the attempt's context: an HTTP/2
		// body closed after its context is done leaves its stream, and so
		// its connection, busy for good.
		c.closeBody()
		c.finish()
	}
	return n, err
}

// Close closes the response body and ends the call.
func (c *call) Close() error {
	err := c.closeBody()
	c.finish()
	return err
}

// closeBody closes the returned response's body once.
func (c *call) closeBody() error {
	if c.rcClosed.Swap(true) {
		return nil
	}
	return c.rc.Close()
}

func (c *call) bodyError(err error) error {
	c.mu.Lock()
	fired, first := c.fired, !c.reported
	if fired == ErrTotalTimeout {
		c.reported = true
	}
	c.mu.Unlock()
	if fired != ErrTotalTimeout {
		return err
	}
	if first {
		c.emit(Event{Kind: EventTotalTimeout, Err: ErrTotalTimeout})
	}
	if errors.Is(err, ErrTotalTimeout) {
		err = nil
	}
	return c.errorf(ErrTotalTimeout, err, "of %v reading the response body", c.totalLimit)
}

// finish ends the call: the timer stops, the attempt's context is released
// and so is the concurrency permit. It is safe to call more than once.
func (c *call) finish() {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return
	}
	c.done = true
	c.releaseTimerLocked()
	cancel := c.cancel
	c.cancel = nil
	c.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	c.releasePermit()
	c.s.callEnded()
}

func (c *call) releasePermit() {
	if c.permit {
		c.permit = false
		c.s.bulkhead.ReleasePermit()
	}
}

// upgraded is the body of a 101 Switching Protocols response: the
// connection itself, writable.
type upgraded struct {
	io.ReadWriteCloser
	c *call
}

func (u upgraded) Close() error {
	err := u.ReadWriteCloser.Close()
	u.c.finish()
	return err
}
