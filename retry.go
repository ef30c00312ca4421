package resilience

import (
	"errors"
	"net/http"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/headers"
)

// retryLoop is a call in its retry loop.
type retryLoop struct{ *call }

// run is the retry loop. It returns the response to give the caller, or
// the error.
func (c retryLoop) run(now time.Time) (*http.Response, error) {
	cfg := c.cfg
	c.repeatable = !cfg.Retry.Disabled && (c.keyed || cfg.methods.repeatable(c.req, c.over))
	rt := routing(c).newRoute() // nil without Endpoints
	if rt != nil {
		defer routing(c).routeEnded(rt)
	}
	var waited time.Duration    // before attempt n
	var prevResp *http.Response // the outcome before attempt n, for a retry refused unsent
	var prevErr error
	for n := 1; ; n++ {
		if n > 1 {
			now = time.Now()
		}
		resp, err, final := sending(c).attempt(now, waited, rt)
		if final {
			if n > 1 && c.budget() != nil {
				c.budget().Release() // never judged: its claim says nothing
			}
			// A retry the overload limiter shed or the circuit refused was
			// not sent: the call ends on the outcome before it, as when the
			// budget refuses one. Only when that outcome was a response too
			// long to keep is the refusal the answer.
			if se, ok := err.(*shedError); ok {
				if prevResp == nil && prevErr == nil {
					return nil, c.errorf(nil, se.OverloadError, "") // the response before was too long to keep
				}
				return c.result(prevResp, prevErr)
			}
			if n > 1 && errors.Is(err, ErrCircuitOpen) && (prevResp != nil || prevErr != nil) {
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
		waitFrom := time.Now()
		wakeAt := waitFrom.Add(wait)
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
		left := c.sleepUntil(wakeAt)
		if c.wantsReport() {
			// what was waited, even if cut short; the retried response
			// drained during the wait, so the wait runs from before that
			c.over.report.Waited += time.Since(waitFrom)
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

// nextDelay returns how long to wait before retry n, which follows the
// attempt that ended with resp and err, and false when that wait is not
// worth making: a Retry-After beyond MaxRetryAfter, or any wait that would
// end past the call's deadline, the earlier of the total timeout and the
// request context's own deadline (http.Client.Timeout is one). A
// Retry-After honoured wins over DelayFunc, which wins over the computed
// delay. elsewhere says the retry goes to another endpoint than resp's:
// resp's Retry-After does not apply to it.
func (c retryLoop) nextDelay(n int, resp *http.Response, err error, elsewhere bool) (time.Duration, bool) {
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
		if p, stop, pok := pushbackOf(resp, c.cfg.Propagation); pok && !stop && (!ok || p > d) {
			d, ok = p, true // the contract's pushback, where it asks for longer
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

// result is what the caller gets when retries stop on an attempt's outcome.
func (c retryLoop) result(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	if errors.Is(err, ErrAttemptTimeout) {
		return nil, c.errorf(ErrAttemptTimeout, nil, "of %v", c.attemptLimit)
	}
	return nil, c.errorf(nil, err, "")
}

// budget returns the handler's retry budget, or nil when the call's options
// disable it.
func (c *call) budget() *budget.Budget {
	if c.cfg.RetryBudget.Disabled {
		return nil
	}
	return c.h.budget
}
