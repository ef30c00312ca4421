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
	unsent := true // every attempt so far failed before its request left the client
	for n := 1; ; n++ {
		if n > 1 {
			now = time.Now()
		}
		resp, err, final := sending(c).attempt(now, waited, rt)
		if final {
			if n > 1 && c.budget() != nil && !c.firstDelivery {
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
		// endpoint (failover) waits the backoff only, and none at all after
		// a connection failure, to an endpoint the call has not tried: that
		// failure says nothing of it. The backoff is for an endpoint tried
		// again, and for one whose circuit would pass the retry on to
		// another.
		elsewhere, atOnce := false, false
		if rt != nil {
			next := rt.ahead(c.h)
			elsewhere = next != rt.last
			atOnce = elsewhere && resp == nil && rt.fresh(next) && connectionFailure(err) &&
				rt.state(c.h, next).circuit.Closed()
		}
		// Such a failover, after attempts that all failed before their
		// request left the client, is the request's first delivery to a
		// server: as a first attempt, it claims no budget token.
		unsent = unsent && resp == nil && undelivered(err)
		free := atOnce && unsent
		wait, ok := c.nextDelay(n, resp, err, elsewhere, atOnce)
		if !ok {
			return c.result(resp, err) // the wait asked for does not fit: answer now
		}
		if why := c.budget().Refuses(); why != nil && !free {
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
		c.firstDelivery = free
		if free {
			continue
		}
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
// resp's Retry-After does not apply to it; atOnce, that it goes there
// after a connection failure, with a computed delay of 0 that takes no
// step of the backoff sequence.
func (c retryLoop) nextDelay(n int, resp *http.Response, err error, elsewhere, atOnce bool) (time.Duration, bool) {
	r := c.cfg.Retry
	var wait time.Duration
	if !atOnce {
		if c.delays == nil {
			c.delays = newBackOff(r)
		}
		wait = min(c.delays.NextBackOff(), r.MaxDelay)
	}
	now := time.Now()
	honoured := false
	if !elsewhere {
		d, asked, ok := c.serverWait(resp, now)
		if !ok {
			return 0, false
		}
		if asked {
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

// serverWait returns the wait resp asks for before the request is sent to
// its server again: its Retry-After (a keyed call's 409's too), or the
// deadline contract's pushback where that asks for longer; asked is false
// when it asks for none, or IgnoreRetryAfter is set. ok is false when the
// wait is not to be made at all (over MaxRetryAfter): the caller gets resp
// at once, or, with Endpoints, the request goes elsewhere. Whether the wait
// fits the call's deadline is the caller's to judge. The retry loop
// (nextDelay) and the hedging race (hedgePauses) both ask it.
func (c *call) serverWait(resp *http.Response, now time.Time) (d time.Duration, asked, ok bool) {
	r := c.cfg.Retry
	if r.IgnoreRetryAfter {
		return 0, false, true
	}
	d, asked = headers.RetryAfter(resp, now)
	if !asked && c.keyed {
		d, asked = conflictRetryAfter(resp, now)
	}
	if p, stop, pok := pushbackOf(resp, c.cfg.Propagation); pok && !stop && (!asked || p > d) {
		d, asked = p, true // the contract's pushback, where it asks for longer
	}
	if asked && r.MaxRetryAfter > 0 && d > r.MaxRetryAfter {
		return 0, true, false
	}
	return d, asked, true
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
