package resilience

import (
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/resilienthttp/resilience/internal/budget"
)

// A retryLoop is the retry layer of one call: it sends the call's
// attempts one after another, on the call's goroutine, until one is the
// answer, waiting between them (nextDelay). It lives on the stack of the
// call's RoundTrip.
type retryLoop struct {
	c      *call
	delays backoff.BackOff // the backoff sequence, made at the first retry
	// firstDelivery says that the next attempt is a failover after attempts
	// whose request never left the client: the retry budget counts it as
	// a first attempt, and it claimed no token.
	firstDelivery bool
}

// run is the retry loop: now is when its first attempt starts. It returns
// the response to give the caller, or the error.
func (l *retryLoop) run(now time.Time) (*http.Response, error) {
	c, cfg := l.c, l.c.cfg
	c.repeatable = !cfg.Retry.Disabled && (c.keyed || cfg.methods.repeatable(c.req, c.over))
	var rt *route // the endpoints the call may go to, with Endpoints
	if cfg.route != nil {
		rt = &route{r: cfg.route}
		defer c.routeEnded(rt)
	}
	var waited time.Duration    // before attempt n
	var prevResp *http.Response // the outcome before attempt n, for a retry refused unsent
	var prevErr error
	unsent := true   // every attempt so far failed before its request left the client
	claimed := false // attempt n holds a retry budget token
	// cut: attempt n-1 was cut at its limit. If attempt n is the last and
	// reaches its own, at an upstream that never answered, the cuts did not
	// help: it is held (deadlines.holds), and a slow upstream that works
	// gets its chance to answer.
	cut := false
	rb, ctx := c.budget(), c.req.Context()
	// A request without a body (nil or http.NoBody) sends that as it is: its
	// attempts have no body to take from the call.
	bodied, none := c.hasBody(), io.ReadCloser(nil)
	if !bodied {
		none = c.req.Body
	}
	for n := 1; ; n++ {
		if n > 1 {
			now = time.Now()
		}
		a := attempt{c: c, n: n, delay: waited, s: c.s, queue: true, first: n == 1 || l.firstDelivery,
			afterCut: cut && n > cfg.Retry.MaxRetries, rb: rb, claimed: claimed, ownBody: bodied, body: none, ctx: ctx, dl: &c.deadlines}
		o, err := l.send(&a, now, rt)
		if err != nil {
			// A retry the overload limiter shed or the circuit refused was
			// not sent: the call ends on the outcome before it, as when the
			// budget refuses one. Only when that outcome was a response too
			// long to keep is the refusal the answer.
			var oe *OverloadError
			if n > 1 && o.kind == outcomeShed && errors.As(o.err, &oe) {
				if prevResp == nil && prevErr == nil {
					return nil, c.errorf(nil, oe, "") // the response before was too long to keep
				}
				return c.result(prevResp, prevErr)
			}
			if n > 1 && errors.Is(err, ErrCircuitOpen) && (prevResp != nil || prevErr != nil) {
				return c.result(prevResp, prevErr)
			}
			return nil, err // rejected, shed, total timeout, cancelled, the request's own failure
		}
		resp, err := o.resp, o.err
		cut = o.cut
		if rt != nil {
			rt.ended(rt.last, err) // an endpoint's own failure drops it from the call
		}
		if !c.retryable || !c.repeatable || n > cfg.Retry.MaxRetries || !c.body.Replayable() || (rt != nil && !rt.left()) {
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
		wait, ok := l.nextDelay(n, resp, err, elsewhere, atOnce)
		if !ok {
			return c.result(resp, err) // the wait asked for does not fit: answer now
		}
		if why := rb.Refuses(); why != nil && !free {
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
		if c.cfg.observed || c.wantsReport() {
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
		l.firstDelivery = free
		claimed = false
		if free || rb == nil {
			continue
		}
		if why := rb.Take(); why != nil {
			if resp != nil && kept == nil {
				// The response is gone (its body was too long to keep):
				// retry rather than answer with nothing.
				rb.ClaimAnyway()
				claimed = true
				continue
			}
			e := Event{Kind: EventBudgetExceeded, Attempt: n, Err: why.Of(err)}
			if kept != nil {
				e.StatusCode = kept.StatusCode
			}
			c.emit(e)
			return c.result(kept, err)
		}
		claimed = true
	}
}

// send sends attempt a of the loop, started at now (to the next endpoint
// of rt, if routed), unless the call is over first. It returns the
// attempt's outcome, or the error that ends the call: the caller left, the
// total deadline passed, the circuit refused, the overload limiter shed,
// the request's own failure.
func (l *retryLoop) send(a *attempt, now time.Time, rt *route) (outcome, error) {
	c := l.c
	if err := c.callerLeft(); err != nil {
		a.settle()
		return outcome{}, c.errorf(nil, err, "") // the caller left: say so, not what the circuit would have said
	}
	if !c.totalAt.IsZero() && !now.Before(c.totalAt) {
		a.settle()
		return outcome{}, c.totalTimeout(nil)
	}
	if rt != nil {
		if c.h.isolated.Load() {
			a.settle()
			return outcome{}, c.rejected(ErrIsolated)
		}
		if err := c.admitRouted(rt, a); err != nil {
			a.settle()
			return outcome{}, c.errorf(ErrCircuitOpen, err, "on every endpoint")
		}
	}
	o := a.send(now)
	if o.sent {
		c.attempts++
		if rt != nil {
			rt.last = a.idx // not before: a retry shed unsent leaves the call on the answer before it (Report.Endpoint)
		}
	}
	switch o.kind {
	case outcomeAnswer, outcomeFailure:
		c.retryable = o.kind == outcomeFailure
		return o, nil
	case outcomeRejected:
		return o, c.rejected(o.err)
	case outcomeShed:
		return o, c.overloadFailure(o.err)
	case outcomeFault:
		return o, c.faulted(o.err)
	case outcomeTotal:
		return o, c.totalTimeout(o.err)
	}
	return o, c.errorf(nil, o.err, "") // abandoned: the caller left
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
func (l *retryLoop) nextDelay(n int, resp *http.Response, err error, elsewhere, atOnce bool) (time.Duration, bool) {
	c, r := l.c, l.c.cfg.Retry
	var wait time.Duration
	if !atOnce {
		if l.delays == nil {
			l.delays = newBackOff(r)
		}
		wait = min(l.delays.NextBackOff(), r.MaxDelay)
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

// result is what the caller gets when the call ends on an attempt's
// outcome: the retry loop's, or the hedging race's last failure.
func (c *call) result(resp *http.Response, err error) (*http.Response, error) {
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

// jitterFactor is the spread of a jittered delay: a base delay d becomes a
// uniformly random value in [d*(1-f), d*(1+f)].
const jitterFactor = 0.5

// newBackOff returns the delay sequence of one call's retries: all zero
// when Delay is negative, the retries then going at once.
//
// The base delay is capped at MaxDelay/(1+f) before jitter, so that jittered
// delays never exceed MaxDelay and, once the cap is reached, still spread
// over [MaxDelay/3, MaxDelay]. Capping after jitter instead would put half of
// them exactly on MaxDelay and line up again the clients jitter keeps apart.
func newBackOff(r RetryOptions) backoff.BackOff {
	if r.Delay < 0 {
		return &backoff.ZeroBackOff{}
	}
	factor := jitterFactor
	if r.NoJitter {
		factor = 0
	}
	ceiling := time.Duration(float64(r.MaxDelay) / (1 + factor))
	if r.Backoff == BackoffLinear {
		return &linearBackOff{delay: r.Delay, max: ceiling, factor: factor}
	}
	multiplier := 2.0
	if r.Backoff == BackoffConstant {
		multiplier = 1
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.Delay,
		RandomizationFactor: factor,
		Multiplier:          multiplier,
		MaxInterval:         ceiling,
		MaxElapsedTime:      0, // the retry layer and the total timeout decide when to stop
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	return b
}

// linearBackOff grows by Delay each time, which backoff/v4 does not offer.
type linearBackOff struct {
	delay, max time.Duration
	factor     float64
	n          int64
}

func (b *linearBackOff) Reset() { b.n = 0 }

func (b *linearBackOff) NextBackOff() time.Duration {
	b.n++
	d := max(b.max, b.delay) // Delay itself is never cut
	if b.n <= int64(d/b.delay) {
		d = b.delay * time.Duration(b.n)
	}
	if b.factor == 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - b.factor + 2*b.factor*rand.Float64()))
}
