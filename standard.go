package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/internal/httpbody"
)

// The standard stack, outermost first: admission (concurrency and rate, in
// admission.go), total deadline, retry (here; or hedging, in hedge.go),
// circuit breaker (probe.go), attempt deadline (both deadlines in
// deadline.go). One call is one *call; its response body, when returned, is
// the call itself (delivery.go), so that the permit and the timer are
// released when the body is closed or read to EOF. What a call tells its
// observers and its caller is in callreport.go.

type call struct {
	h    *Handler
	cfg  *config // the options the call started under, for its whole life
	s    *hostState
	base http.RoundTripper
	req  *http.Request
	over *overrides // the request's overrides, if any
	body httpbody.Replay

	admission // admission.go
	retrying
	deadlines // deadline.go
	delivery  // delivery.go
}

// retrying is the retry loop's state.
type retrying struct {
	attempts   int  // attempts sent so far
	repeatable bool // the request may be sent more than once
	keyed      bool // the request carries an idempotency key its upstream keeps
	retryable  bool // the last attempt failed in a way the retry layer retries
	prepared   bool // body.prepare has run
	quotaTaken bool // admission took the call's share of the server's quota (admission.go)
	delays     backoff.BackOff
}

func (h *Handler) roundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	cfg := h.cfg.Load() // one snapshot for the whole call: an Update applies from the next call
	if req.URL == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("resilience: handler %q: nil Request.URL", cfg.Name)
	}
	c := &call{h: h, cfg: cfg, s: h.stateFor(req), base: base, req: req}
	c.body.Hold(req.Body) // closed at the end if no attempt sends it
	c.attemptLimit, c.totalLimit = max(0, cfg.AttemptTimeout), max(0, cfg.TotalTimeout)
	if o := overridesFrom(req.Context()); o != nil {
		c.over = o
		if o.hasAttempt {
			c.attemptLimit = max(0, o.attempt)
		}
		if o.hasTotal {
			c.totalLimit = max(0, o.total)
		}
	}
	c.keyRequest()
	now := time.Now()
	if c.totalLimit > 0 {
		c.totalAt = now.Add(c.totalLimit)
	}
	queued, err := c.admit()
	if err != nil {
		c.body.Close()
		c.ended(now, nil, err)
		c.finish()
		return nil, err
	}
	var resp *http.Response
	if cfg.Hedging.Enabled {
		resp, err = c.hedge(now)
	} else {
		first := now
		if queued {
			first = time.Now() // the first attempt starts after the wait
		}
		resp, err = c.run(first)
	}
	c.body.Close()
	c.ended(now, resp, err)
	if err != nil {
		c.finish()
		if cfg.Fallback.Enabled {
			return c.fallback(err)
		}
		return nil, err
	}
	if cfg.Fallback.Enabled && resp.StatusCode >= 500 {
		if kept, err := c.fallbackOnStatus(resp); kept != resp {
			c.finish()
			return kept, err
		}
	}
	c.deliver(resp)
	return resp, nil
}

// run is the retry loop. It returns the response to give the caller, or
// the error.
func (c *call) run(now time.Time) (*http.Response, error) {
	cfg := c.cfg
	c.repeatable = !cfg.Retry.Disabled && (c.keyed || cfg.methods.repeatable(c.req, c.over))
	rt := c.newRoute() // nil without Hedging.Endpoints
	if rt != nil {
		defer c.routeEnded(rt)
	}
	var waited time.Duration    // before attempt n
	var prevResp *http.Response // the outcome before attempt n, for a retry the overload limiter sheds
	var prevErr error
	for n := 1; ; n++ {
		if n > 1 {
			now = time.Now()
		}
		resp, err, final := c.attempt(now, waited, rt)
		if final {
			if n > 1 && c.budget() != nil {
				c.budget().Release() // never judged: its claim says nothing
			}
			if se, ok := err.(*shedError); ok {
				if prevResp == nil && prevErr == nil {
					return nil, c.errorf(nil, se.OverloadError, "") // the response before was too long to keep
				}
				return c.result(prevResp, prevErr)
			}
			return nil, err // rejected, total timeout, cancelled, the request's own failure
		}
		if rt != nil {
			rt.ended(rt.last, err) // an endpoint's own failure drops it from the call
		}
		if !c.repeatable || n > cfg.Retry.MaxRetries || !c.body.Replayable() || !c.retryable || (rt != nil && !rt.left()) {
			return c.result(resp, err)
		}
		// A Retry-After is the answering server's: a retry sent to another
		// endpoint (failover) waits the backoff only.
		wait, ok := c.nextDelay(n, resp, err, rt != nil && rt.ahead(c.h) != rt.last)
		if !ok {
			return c.result(resp, err) // the wait asked for does not fit: answer now
		}
		if why := c.budget().Refuses(); why != nil {
			e := Event{Kind: EventBudgetExceeded, Attempt: n, Err: why.Of(err)}
			if resp != nil {
				e.StatusCode = resp.StatusCode
			}
			c.emit(e)
			return c.result(resp, err)
		}
		wakeAt := time.Now().Add(wait)
		waited = wait
		if c.cfg.observed() || c.wantsReport() {
			e := Event{Kind: EventRetry, Attempt: n, Delay: wait, Err: err}
			if resp != nil {
				e.StatusCode = resp.StatusCode
			}
			c.emit(e)
		}
		var kept *http.Response
		if resp != nil {
			kept = c.discard(resp)
		}
		prevResp, prevErr = kept, err
		sleptAt := time.Now()
		left := c.sleepUntil(wakeAt)
		if c.wantsReport() {
			c.over.report.Waited += time.Since(sleptAt) // what was waited, even if cut short
		}
		if left != nil {
			return nil, c.errorf(nil, left, "waiting to retry")
		}
		// Claim a token now: the retries sent while this call waited may have
		// failed and emptied the budget. Asked only before the wait, every
		// call that failed within one backoff delay of an outage's start
		// would retry into it.
		if why := c.budget().Take(); why != nil {
			if resp != nil && kept == nil {
				// The response is gone (its body was too long to keep):
				// retry rather than answer with nothing.
				c.budget().ClaimAnyway()
				continue
			}
			e := Event{Kind: EventBudgetExceeded, Attempt: n, Err: why.Of(err)}
			if kept != nil {
				e.StatusCode = kept.StatusCode
			}
			c.emit(e)
			return c.result(kept, err)
		}
	}
}

// budget returns the handler's retry budget, or nil when the call's options
// disable it.
func (c *call) budget() *budget.Budget {
	if c.cfg.RetryBudget.Disabled {
		return nil
	}
	return c.h.budget
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

// nextDelay returns how long to wait before retry n, which follows the
// attempt that ended with resp and err, and false when that wait is not
// worth making: a Retry-After beyond MaxRetryAfter, or any wait that would
// end past the call's deadline, the earlier of the total timeout and the
// request context's own deadline (http.Client.Timeout is one). A
// Retry-After honoured wins over DelayFunc, which wins over the computed
// delay. elsewhere says the retry goes to another endpoint than resp's:
// resp's Retry-After does not apply to it.
func (c *call) nextDelay(n int, resp *http.Response, err error, elsewhere bool) (time.Duration, bool) {
	r := c.cfg.Retry
	if c.delays == nil {
		c.delays = newBackOff(r)
	}
	wait := min(c.delays.NextBackOff(), r.MaxDelay)
	now := time.Now()
	honoured := false
	if !r.IgnoreRetryAfter && !elsewhere {
		d, ok := headers.RetryAfter(resp, now)
		if !ok && c.keyed {
			d, ok = conflictRetryAfter(resp, now)
		}
		if ok {
			if r.MaxRetryAfter > 0 && d > r.MaxRetryAfter {
				return 0, false
			}
			wait, honoured = d, true
		}
	}
	if f := r.DelayFunc; f != nil && !honoured {
		if d := f(DelayInfo{Retry: n, Delay: wait, Response: resp, Err: err, Request: c.req}); d >= 0 {
			wait = d
		}
		now = time.Now() // the function's own time counts against the deadline
	}
	if deadline := c.deadline(); !deadline.IsZero() && !now.Add(wait).Before(deadline) {
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
func (c *call) attempt(now time.Time, waited time.Duration, rt *route) (resp *http.Response, err error, final bool) {
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
	s, ep := c.s, (*endpoint)(nil)
	var probe uint64
	if rt != nil {
		if ep, s, probe, err = c.admitRouted(rt); err != nil {
			return nil, c.errorf(ErrCircuitOpen, err, "on every endpoint"), true
		}
	} else if probe, err = s.admit(); err != nil {
		return nil, c.rejected(err), true
	}
	slot, err := c.takeSlot(c.req.Context(), s, c.attempts+1, true)
	if err != nil {
		s.releaseProbe(probe) // nothing was sent
		var oe *OverloadError
		if c.attempts > 0 && errors.As(err, &oe) {
			return nil, &shedError{oe}, true // a retry shed: the call ends on the outcome before
		}
		return nil, c.overloadFailure(err), true
	}
	if slot.l != nil {
		now = slot.at // the attempt's deadline runs from the end of its wait for a slot
	}
	if !c.prepared {
		// Only now, once the call will be sent, is the body read ahead.
		c.prepared = true
		if err := c.body.Prepare(c.req, c.repeatable, c.cfg.MaxBufferedBody); err != nil {
			slot.release(overloadDropped, 0)
			s.releaseProbe(probe) // the request's own failure
			return nil, c.errorf(nil, err, ""), true
		}
	}
	body, getBody, err := c.body.Next()
	if err != nil {
		slot.release(overloadDropped, 0)
		s.releaseProbe(probe)
		return nil, c.errorf(nil, err, ""), true
	}

	ctx, cancel := context.WithCancelCause(c.req.Context())
	r, sent := c.attemptRequest(ctx, body, getBody)
	if ep != nil {
		ep.retarget(r)
	}
	c.attempts++
	c.start(cancel, now)
	sentAt := c.sendingAttempt(c.attempts)
	resp, err = c.base.RoundTrip(r)
	c.attemptAnswered(sentAt, resp)
	fired := c.headers()
	if slot.l != nil {
		o := c.overloadOutcome(resp, err, fired)
		if o == overloadLoss && requestFault(sent, err) != nil {
			o = overloadDropped
		}
		slot.release(o, time.Since(slot.at))
	}
	c.attemptEnded(c.attempts, now, waited, resp, err, fired, ep)

	switch {
	case fired == ErrTotalTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		s.abandonProbe(probe, ErrTotalTimeout)
		return nil, c.totalTimeout(err), true
	case fired == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		resp, err = nil, ErrAttemptTimeout
		e := Event{Kind: EventAttemptTimeout, Err: err}
		if ep != nil {
			e.Endpoint, e.Host = ep.base, s.host
		}
		c.emit(e)
	case err != nil && c.callerLeft() != nil:
		s.abandonProbe(probe, err)
		return nil, c.errorf(nil, err, ""), true
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			s.releaseProbe(probe) // says nothing about the upstream
			return nil, c.errorf(nil, fault, ""), true
		}
	}
	c.retryable = c.judge(s, c.attempts == 1, c.budget(), resp, err)
	return resp, err, false
}

// attemptRequest returns the request of one attempt, a shallow copy of the
// caller's on ctx carrying body, and the httpbody.Sent that tracks it, if any.
func (c *call) attemptRequest(ctx context.Context, body io.ReadCloser, getBody func() (io.ReadCloser, error)) (*http.Request, *httpbody.Sent) {
	r := c.req.WithContext(ctx)
	if body == nil || body == http.NoBody {
		r.Body, r.GetBody = body, getBody
		return r, nil
	}
	sent := httpbody.Track(body, c.req.ContentLength, getBody)
	r.Body, r.GetBody = sent, nil
	if getBody != nil {
		r.GetBody = sent.Rewind
	}
	return r, sent
}

// requestFault returns the failure of the request itself behind err, the
// error of an attempt that sent body: its body's reader failed, its body
// did not match its ContentLength, or the transport refused it as
// malformed. Such a failure is the caller's: it is not retried, and neither
// the circuit breaker nor the retry budget counts it.
func requestFault(body *httpbody.Sent, err error) error {
	if isRequestError(err) {
		return err
	}
	if fault := body.Fault(); fault != nil {
		if errors.Is(err, errors.Unwrap(fault)) {
			return err // the transport returned the reader's error itself
		}
		return fmt.Errorf("%w (%v)", fault, err)
	}
	return nil
}

// judge tells s's circuit breaker and the retry budget rb (nil for none: an
// attempt the budget does not count) how an attempt went (the first of its
// call, or a later one), and reports whether it is a
// failure the retry layer would retry. The standard classification
// (IsTransient) is computed once for all three; with Hedging.Endpoints it
// counts an endpoint's own failure (endpointFault) too, which moves the
// call on to another endpoint.
func (c *call) judge(s *hostState, first bool, rb *budget.Budget, resp *http.Response, err error) (retryable bool) {
	cfg := c.cfg
	var transient bool
	if cfg.Retry.ShouldRetry == nil || cfg.CircuitBreaker.ShouldHandle == nil {
		transient = IsTransient(resp, err) || (cfg.route != nil && endpointFault(err))
	}
	retryable = transient
	if f := cfg.Retry.ShouldRetry; f != nil {
		retryable = f(c.req, resp, err)
	}
	if c.keyed {
		retryable = keyedVerdict(resp, retryable, cfg.Retry.ShouldRetry != nil)
	}
	if b := s.breaker(); b != nil {
		failed := transient
		if f := cfg.CircuitBreaker.ShouldHandle; f != nil {
			failed = f(resp, err)
		}
		if failed {
			s.failures.record(resp, err)
			b.RecordFailure()
		} else {
			b.RecordSuccess()
		}
	}
	if rb != nil {
		rb.Record(first, retryable)
	}
	return retryable
}
