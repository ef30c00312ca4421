package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/internal/httpbody"
)

// sending is a call sending one attempt, through its retry loop or its
// hedging race.
type sending struct{ *call }

// attempt sends one attempt through the circuit breaker under the attempt
// deadline. When final is true the call is over and err says why; otherwise
// the outcome is the attempt's, for the retry layer to judge.
func (c sending) attempt(now time.Time, waited time.Duration, rt *route) (resp *http.Response, err error, final bool) {
	h := c.h
	if err := c.callerLeft(); err != nil {
		return nil, c.errorf(nil, err, ""), true // the caller left: say so, not what the circuit would have said
	}
	if !c.totalAt.IsZero() && !now.Before(c.totalAt) {
		return nil, reporting(c).totalTimeout(nil), true
	}
	if h.isolated.Load() {
		return nil, reporting(c).rejected(ErrIsolated), true
	}
	s, ep := c.s, (*endpoint)(nil)
	var probe uint64
	if rt != nil {
		if ep, s, probe, err = routing(c).admitRouted(rt); err != nil {
			return nil, c.errorf(ErrCircuitOpen, err, "on every endpoint"), true
		}
	} else if probe, err = s.circuit.Admit(); err != nil {
		return nil, reporting(c).rejected(err), true
	}
	slot, err := c.takeSlot(c.req.Context(), s, c.attempts+1, true, now, nil)
	if err != nil {
		s.circuit.ReleaseProbe(probe) // nothing was sent
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
			slot.release(overloadDropped)
			s.circuit.ReleaseProbe(probe) // the request's own failure
			return nil, c.faulted(err), true
		}
	}
	body, getBody, err := c.body.Next()
	if err != nil {
		slot.release(overloadDropped)
		s.circuit.ReleaseProbe(probe)
		return nil, c.faulted(err), true
	}

	ctx, cancel := c.req.Context(), context.CancelCauseFunc(nil)
	if c.cancelable() {
		ctx, cancel = context.WithCancelCause(ctx)
	}
	r, sent := c.attemptRequest(ctx, c.attempts+1, waited, ep, body, getBody)
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
		slot.release(o)
	}
	reporting(c).attemptEnded(c.attempts, now, waited, resp, err, fired, ep, nil)

	switch {
	case fired == ErrTotalTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		s.abandonProbe(probe, ErrTotalTimeout)
		return nil, reporting(c).totalTimeout(err), true
	case fired == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		resp, err = nil, ErrAttemptTimeout
		e := Event{Kind: EventAttemptTimeout, Err: err}
		if ep != nil {
			ep.label(&e)
		}
		c.emit(e)
	case err != nil && c.callerLeft() != nil:
		s.abandonProbe(probe, err)
		return nil, c.errorf(nil, err, ""), true
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			s.circuit.ReleaseProbe(probe) // says nothing about the upstream
			return nil, c.faulted(fault), true
		}
	}
	c.retryable = c.judge(s, c.attempts == 1 || c.firstDelivery, c.budget(), resp, err, nil)
	return resp, err, false
}

// cancelable reports whether the call's attempts need a context of their
// own, which its timer cancels: for a deadline, or to bound the draining
// of a response that is retried. A call with neither sends its attempt on
// the caller's context, and saves the context's two allocations.
func (c sending) cancelable() bool {
	return c.attemptLimit > 0 || !c.totalAt.IsZero() || c.repeatable
}

// attemptRequest returns the request of attempt n, sent after waiting
// delay (to ep, if routed): a shallow copy of the caller's on ctx carrying
// body, and the httpbody.Sent that tracks it, if any. For a handler with
// observers (OnEvent or Logger), AttemptFromContext finds the attempt under
// the copy's context, which shares the copy's allocation (observedRequest):
// observers cost no allocation where the copy is made anyway. When the copy
// would be the caller's request field for field, and no endpoint will
// retarget it, it is the caller's request, unless an observer needs the
// attempt's context.
func (c sending) attemptRequest(ctx context.Context, n int, delay time.Duration, ep *endpoint, body io.ReadCloser, getBody func() (io.ReadCloser, error)) (*http.Request, *httpbody.Sent) {
	stamped := c.cfg.Propagation.Enabled
	var r *http.Request
	if c.cfg.observed() {
		o := &observedRequest{ctx: attemptContext{Context: ctx, c: c.call, n: n, delay: delay, ep: ep}}
		o.req = *c.req.WithContext(&o.ctx) // inlined: the copy is o's, not one more allocation
		r = &o.req
	} else if ctx == c.req.Context() && body == nil && getBody == nil && c.req.Body == nil && c.req.GetBody == nil && ep == nil && !stamped {
		return c.req, nil // nothing of the caller's request would change: send it as it is
	} else {
		r = c.req.WithContext(ctx)
	}
	if stamped {
		budget, ok := c.attemptBudget(time.Now())
		r.Header = stamp(c.req.Header, c.cfg.Propagation.Headers, n, budget, ok)
	}
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
// failure the retry layer would retry; its event, if any, goes to rec
// (record). The standard classification
// (IsTransient) is computed once for all three; with Endpoints it
// counts an endpoint's own failure (endpointFault) too, which moves the
// call on to another endpoint.
func (c sending) judge(s *hostState, first bool, rb *budget.Budget, resp *http.Response, err error, rec *attemptEvents) (retryable bool) {
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
	_, stop, _ := pushbackOf(resp, cfg.Propagation)
	if stop {
		retryable = false // the server's word: whatever the rules say, not again
		c.record(rec, Event{Kind: EventPushback, StatusCode: resp.StatusCode})
	}
	if s.circuit.Enabled() {
		failed := transient
		if f := cfg.CircuitBreaker.ShouldHandle; f != nil {
			failed = f(resp, err)
		}
		if failed {
			s.circuit.RecordFailure(describe(resp, err, c.req.URL))
		} else {
			s.circuit.RecordSuccess()
		}
	}
	switch {
	case rb == nil:
	case stop:
		rb.Pushback(first)
	default:
		rb.Record(first, retryable)
	}
	return retryable
}

// takeSlot takes a slot of s's overload limiter for the call's attempt n,
// if the limiter is on: at now, unless it waits for one. A first attempt, or a retry while the limiter is
// not shedding, waits for one (queue), at most MaxQueueWait and never past
// the call's deadline; a hedge only tries. ctx is the attempt's. A refusal
// is reported (EventOverloadShed, to rec: record) and returned: an
// *OverloadError, or ctx's error if the caller left while waiting.
func (c sending) takeSlot(ctx context.Context, s *hostState, n int, queue bool, now time.Time, rec *attemptEvents) (overloadSlot, error) {
	l := s.policies.Load().overload
	if l == nil {
		return overloadSlot{}, nil
	}
	var wait time.Duration
	var until time.Time
	if queue {
		wait, until = l.opts.MaxQueueWait, c.deadline()
	}
	slot, err := l.acquire(ctx, wait, until, n, now)
	if err == nil && !l.reported.Load() {
		return slot, nil // only a refusal starts the overloaded state, and it ends only once started
	}
	var oe *OverloadError
	if errors.As(err, &oe) {
		c.record(rec, Event{Kind: EventOverloadShed, Host: s.host, Attempt: n, Err: oe})
	}
	if now, changed := l.overloaded(); changed {
		kind := EventOverloadEnded
		if now {
			kind = EventOverloaded
		}
		e := Event{Kind: kind, Host: s.host}
		if oe != nil {
			e.Err = oe
		}
		c.h.emit(e)
	}
	return slot, err
}

// overloadOutcome is what an attempt that ended with resp and err (fired: the
// deadline that cut it, if any) tells the overload limiter.
func (c sending) overloadOutcome(resp *http.Response, err, fired error) overloadOutcome {
	switch {
	case fired == ErrAttemptTimeout:
		return overloadTimeout
	case fired != nil || c.callerLeft() != nil:
		return overloadDropped
	case err != nil:
		if errors.Is(err, syscall.ECONNREFUSED) {
			return overloadLoss
		}
		return overloadDropped
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		return overloadLoss
	}
	return overloadAnswered
}

// A shedError says that the overload limiter shed a retry: the call ends on
// the outcome before it.
type shedError struct{ *OverloadError }

// overloadFailure is the error of a call whose first attempt the limiter
// refused.
func (c sending) overloadFailure(err error) error {
	if errors.Is(err, ErrOverloaded) {
		return c.errorf(nil, err, "")
	}
	return c.errorf(nil, err, "waiting for a slot")
}

// sendingAttempt notes that attempt n of the call is being sent, and
// returns when, or zero if the quota is not followed yet. A retry or hedge
// spends from the quota, and so does a first attempt whose call was
// admitted before the quota was followed; the others took their share at
// admission.
func (c sending) sendingAttempt(n int) time.Time {
	if !c.cfg.followsServer() {
		return time.Time{}
	}
	q := &c.s.quota
	q.sending.Add(1)
	if !q.active.Load() {
		return time.Time{}
	}
	now := time.Now()
	if n > 1 || !c.quotaTaken {
		q.spend(now)
	}
	return now
}

// attemptAnswered notes the end of an attempt sendingAttempt returned
// sentAt for, and what its response, if any, says of the quota.
func (c sending) attemptAnswered(sentAt time.Time, resp *http.Response) {
	if !c.cfg.followsServer() {
		return
	}
	q := &c.s.quota
	if resp != nil {
		h := resp.Header
		var has, otherwise bool
		if _, ok := c.base.(*http.Transport); ok {
			has = headers.HasQuota(h)
		} else if has, otherwise = headers.ScanQuota(h); otherwise {
			h = headers.CanonicalClone(h) // net/http's canonicalizes what it reads; another may not
			has = headers.HasQuota(h)
		}
		if resp.StatusCode == http.StatusTooManyRequests || has {
			q.observe(c.req, resp, h, sentAt, time.Now(), c.cfg.maxServerWait(), c.cfg.RateLimit.PauseOn429)
			return
		}
	}
	q.sending.Add(-1)
}

// An attemptContext is the context of an attempt's request: the attempt's
// own context, which it forwards everything to, and what AttemptFromContext
// says of the attempt: one value carries both, where context.WithValue
// would take two, and it shares its request's allocation (observedRequest).
type attemptContext struct {
	context.Context
	c     *call
	n     int
	delay time.Duration
	ep    *endpoint // nil unless routed by Endpoints
}

type attemptKey struct{}

// An observedRequest is an attempt's request and its attemptContext in one
// allocation: the request copy an attempt needs anyway (a context of its
// own for its deadlines, a body to track, an endpoint to retarget it to)
// carries what AttemptFromContext says of it at no extra allocation.
type observedRequest struct {
	req http.Request
	ctx attemptContext
}

func (a *attemptContext) Value(key any) any {
	if key == (attemptKey{}) {
		return a
	}
	return a.Context.Value(key)
}
