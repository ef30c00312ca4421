package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/httpbody"
	"github.com/resilienthttp/resilience/internal/overload"
)

// An attempt is one sending of a call's request: where it goes, what it
// holds (a circuit permit, an overload slot, a retry budget token), its
// context and deadline. The retry loop (retry.go) and the hedging race
// (hedge.go) each make one per attempt and send it the same way (send),
// the loop on the call's goroutine, the race on a goroutine of the
// attempt's own; what send comes to is an outcome, and only the call's
// goroutine acts on it.
type attempt struct {
	c     *call
	n     int           // its number, from 1, in the order the call's attempts are sent (a hedge's: sends.commit)
	delay time.Duration // waited before it, as EventAttempt says
	s     *hostState    // whose circuit and overload limiter it goes through
	ep    *endpoint     // with Endpoints, where it goes; nil otherwise
	idx   int           // ep's index in the route
	probe uint64        // the circuit's half-open probe it is, if any

	admitted bool // the route took the circuit's permit (admitRouted): send does not ask
	queue    bool // it waits for an overload slot (a first attempt, a retry); a hedge only tries
	afterCut bool // it is the call's last, and follows one of its attempts cut at its limit (deadlines.holds)
	hedge    bool // a hedge sent while an earlier attempt runs: never shed for a sluggish upstream (takeSlot)
	first    bool // the retry budget counts it as a first attempt
	claimed  bool // it holds a token of rb, which its judgement, or its end unjudged, settles

	rb *budget.Budget // the retry budget that judges it; nil: not counted

	// ownBody says that send takes the request's body from the call, on the
	// call's goroutine, once it is sure to be sent; otherwise body and
	// getBody are the attempt's, taken by the loop that made it.
	ownBody bool
	body    io.ReadCloser
	getBody func() (io.ReadCloser, error)

	// ctx is what its request's context derives from; cancel, if not nil,
	// cancels the attempt with a cause (a hedge's: the race's loss).
	ctx    context.Context
	cancel context.CancelCauseFunc
	dl     *deadlines     // its deadlines: the call's, or a hedge's own
	rec    *attemptEvents // nil: its events are emitted as they come (the call's goroutine)

	// race, for a hedge, numbers it as it is sent (sends.commit), and
	// sentAt is then when (UnixNano); the race ending while it is still
	// queued stops it first if it can: it is then never sent.
	race   *sends
	sentAt int64
}

// What an attempt came to.
type outcomeKind uint8

const (
	outcomeAnswer    outcomeKind = iota // a response or error the retry layer does not retry: the call's answer
	outcomeFailure                      // a failure the retry layer retries
	outcomeRejected                     // the circuit refused it, or the handler is isolated; nothing was sent
	outcomeShed                         // the overload limiter refused it, or the caller left while it queued; nothing was sent
	outcomeFault                        // the request's own failure (its body, its form): the call ends on it
	outcomeTotal                        // the total deadline cut it
	outcomeAbandoned                    // cancelled: the caller left, the race was lost, or it was never sent
)

// An outcome is what an attempt came to: its response or error, and
// what that is to the call.
type outcome struct {
	resp *http.Response
	err  error // for outcomeRejected, why the circuit is open; for outcomeShed, the limiter's refusal
	kind outcomeKind
	sent bool // its request went to the base RoundTripper
	cut  bool // its attempt deadline cut it
}

// send sends the attempt: it asks the circuit (unless the route did), takes
// an overload slot, builds the attempt's request, sends it under the
// attempt's deadline, and tells the overload limiter, the server quota, the
// circuit and the retry budget how it went. Its events go to a.rec, or are
// emitted. now is when it was started: its deadline runs from then, or
// from the end of its wait for a slot.
func (a *attempt) send(now time.Time) outcome {
	c := a.c
	if !a.admitted {
		var refused error
		if c.h.isolated.Load() {
			refused = ErrIsolated
		} else {
			a.probe, refused = a.s.circuit.Admit()
		}
		if refused != nil {
			a.unsent()
			return outcome{err: refused, kind: outcomeRejected}
		}
	}
	slot, err := a.takeSlot(now)
	if err != nil {
		a.unsent()
		a.s.circuit.ReleaseProbe(a.probe) // nothing was sent
		return outcome{err: err, kind: outcomeShed}
	}
	if slot.Held() {
		now = slot.At() // the attempt's deadline runs from the end of its wait for a slot
	}
	if a.ownBody {
		// The request's body, taken from the call; read ahead the first
		// time, once the call is sure to be sent.
		var err error
		if !c.body.Prepared() {
			err = c.body.Prepare(c.req, c.repeatable, c.cfg.MaxBufferedBody)
		}
		if err == nil {
			a.body, a.getBody, err = c.body.Next()
		}
		if err != nil {
			a.settle()
			slot.Release(overload.Dropped)
			a.s.circuit.ReleaseProbe(a.probe) // the request's own failure
			return outcome{err: err, kind: outcomeFault}
		}
	}
	// Until a hedge is sent, its n is provisional: 1 for the call's first
	// attempt alone. Sent, it is numbered in the order sent, which may put
	// a hedge before the first attempt.
	retry := a.n > 1
	if a.race != nil && !a.race.commit(a, now) { // the race ended while it queued: never sent
		a.unsent()
		slot.Release(overload.Dropped)
		a.s.circuit.ReleaseProbe(a.probe)
		return outcome{kind: outcomeAbandoned}
	}

	ctx, cancel := a.ctx, a.cancel
	if cancel == nil && c.cancelable() {
		ctx, cancel = context.WithCancelCause(ctx)
	}
	r, sent := a.request(ctx)
	if a.ep != nil {
		a.ep.retarget(r)
	}
	a.dl.start(cancel, a.afterCut, !a.s.answers.Load(), c.attemptLimit, now)
	sentAt := c.sendingAttempt(retry)
	resp, err := c.base.RoundTrip(r)
	c.attemptAnswered(sentAt, resp)
	fired, held := a.dl.answered() // the deadline that cut it, if one did
	if held {
		a.record(Event{Kind: EventAttemptHeld, Attempt: a.n, Duration: time.Since(now)})
	}
	if fired == nil && err != nil && context.Cause(ctx) == ErrTotalTimeout {
		fired = ErrTotalTimeout // a hedge: the race's context reached the total deadline
	}
	if a.dl != &c.deadlines {
		a.dl.mu.Lock()
		a.dl.releaseTimerLocked() // its headers came, or it failed: a hedge's deadline is done
		a.dl.mu.Unlock()
	}
	left := err != nil && fired == nil && (context.Cause(ctx) != nil || c.callerLeft() != nil)
	// The caller gave up on it past its limit: as one held until the total
	// deadline, the upstream failed it, for the limiter, the breaker and
	// the budget alike.
	gaveUp := left && held && c.callerLeft() != nil
	if slot.Held() {
		o := c.overloadOutcome(resp, err, fired, held)
		if (left && !gaveUp) || (o == overload.Loss && requestFault(sent, err) != nil) {
			o = overload.Dropped
		}
		slot.Release(o)
	}
	if c.cfg.observed {
		a.ended(now, resp, err, fired)
	}
	if hg := &c.cfg.Hedging; hg.Enabled && hg.DelayPercentile > 0 && !left && fired != ErrTotalTimeout {
		c.h.latency.Record(time.Since(now)) // an attempt cut short by another's end says nothing of the latency
	}

	switch {
	case fired == ErrTotalTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		if held {
			// It outlived its own limit before the call's: the upstream
			// failed it as surely as one cut at that limit, and the
			// breaker and the budget count it so.
			a.judge(nil, ErrAttemptTimeout)
		} else {
			a.s.abandonProbe(a.probe, ErrTotalTimeout)
		}
		a.settle()
		return outcome{err: err, kind: outcomeTotal, sent: true}
	case fired == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		resp, err = nil, ErrAttemptTimeout
		a.record(Event{Kind: EventAttemptTimeout, Attempt: a.n, Err: err})
	case left:
		if gaveUp {
			a.judge(nil, ErrAttemptTimeout)
		} else {
			a.s.abandonProbe(a.probe, err) // the race's loser, or the caller gave up
		}
		a.settle()
		return outcome{err: err, kind: outcomeAbandoned, sent: true}
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			a.settle()
			a.s.circuit.ReleaseProbe(a.probe) // says nothing about the upstream
			return outcome{err: fault, kind: outcomeFault, sent: true}
		}
	}
	if a.judge(resp, err) {
		return outcome{resp: resp, err: err, kind: outcomeFailure, sent: true, cut: fired == ErrAttemptTimeout}
	}
	if err == nil && resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests {
		// Served: the upstream's queue has moved past every attempt sent
		// before this one (overtaken). A refusal shows no such thing,
		// retried or not: a fast 503 from an upstream shedding new
		// arrivals, or a server half's pushback (not to be retried). Counted
		// as served, pushbacks cut 109-113 queued attempts per run at their
		// limit in the fleet experiment's shedding upstream at N = 10.
		c.h.answered(a.dl.sent) // start's, on this goroutine
		a.s.served()
	}
	return outcome{resp: resp, err: err, kind: outcomeAnswer, sent: true}
}

// unsent settles an attempt that was never sent: its budget token goes
// back, and so does the body it was given (RoundTrip closes the bodies it
// sends, and only those).
func (a *attempt) unsent() {
	a.settle()
	if a.body != nil && !a.ownBody {
		a.body.Close()
	}
}

// settle gives back the retry budget token of an attempt that is not
// judged: its end says nothing of the upstream.
func (a *attempt) settle() {
	if a.claimed {
		a.claimed = false
		a.rb.Release()
	}
}

// cancelable reports whether the call's sequential attempts need a context
// of their own, which its timer cancels: for a deadline, or to bound the
// draining of a response that is retried. A call with neither sends its
// attempt on the caller's context, and saves the context's two allocations.
func (c *call) cancelable() bool {
	return c.attemptLimit > 0 || !c.totalAt.IsZero() || c.repeatable
}

// request returns the request of attempt a, sent after waiting
// delay (to ep, if routed): a shallow copy of the caller's on ctx carrying
// body, and the httpbody.Sent that tracks it, if any. For a handler with
// observers (OnEvent or Logger), AttemptFromContext finds the attempt under
// the copy's context, which shares the copy's allocation (observedRequest):
// observers cost no allocation where the copy is made anyway. When the copy
// would be the caller's request field for field, and no endpoint will
// retarget it, it is the caller's request, unless an observer needs the
// attempt's context. The first sequential attempt's copy is the call's
// (call.first), which saved one allocation of the handler's four on the
// success path, about 200 of its 5,000 instructions (bench/instructions.sh).
func (a *attempt) request(ctx context.Context) (*http.Request, *httpbody.Sent) {
	c, n, delay, ep, body, getBody := a.c, a.n, a.delay, a.ep, a.body, a.getBody
	stamped := c.cfg.Propagation.Enabled
	var r *http.Request
	// The first sequential attempt's request is the call's (c.first); a
	// retry's or a hedge's is one of its own, as the first may still be in
	// use.
	o := &c.first
	if n > 1 || a.dl != &c.deadlines {
		o = nil
	}
	if c.cfg.observed {
		if o == nil {
			o = new(observedRequest)
		}
		o.ctx = attemptContext{Context: ctx, c: c, n: n, delay: delay, ep: ep}
		o.req = *c.req.WithContext(&o.ctx) // inlined: the copy is o's, not one more allocation
		r = &o.req
	} else if ctx == c.req.Context() && body == nil && getBody == nil && c.req.Body == nil && c.req.GetBody == nil && ep == nil && !stamped {
		return c.req, nil // nothing of the caller's request would change: send it as it is
	} else if o != nil {
		o.req = *c.req.WithContext(ctx) // inlined, as above
		r = &o.req
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

// judge tells the attempt's circuit breaker and retry budget (if it counts
// it) how it went, and reports whether its outcome, resp and err, is a
// failure the retry layer would retry; its event, if any, goes to a.rec
// (record). The standard classification (IsTransient) is computed once for
// all three; with Endpoints it counts an endpoint's own failure
// (endpointFault) too, which moves the call on to another endpoint. A 101
// Switching Protocols is never retried: its connection is the caller's.
func (a *attempt) judge(resp *http.Response, err error) (retryable bool) {
	c, cfg := a.c, a.c.cfg
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
	stop := false // the server's word: whatever the rules say, not again
	if cfg.Propagation.Enabled {
		_, stop, _ = pushbackOf(resp, cfg.Propagation)
	}
	if stop {
		retryable = false
		c.record(a.rec, Event{Kind: EventPushback, Attempt: a.n, StatusCode: resp.StatusCode})
	}
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		retryable = false
	}
	if s := a.s; s.circuit.Enabled() {
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
	switch rb := a.rb; {
	case rb == nil:
	case stop:
		rb.Pushback(a.first)
	default:
		rb.Record(a.first, retryable)
	}
	a.claimed = false // judged: the budget settled its claim
	return retryable
}

// AttemptFromContext reports which attempt of a call ctx belongs to, for the
// context of an attempt's request a Handler with OnEvent or Logger sends: an
// EventAttempt as it is about to be sent, with Duration, StatusCode and Err
// zero; otelresilience gives each attempt a client span by it. For any other
// context, ok is false.
func AttemptFromContext(ctx context.Context) (e Event, ok bool) {
	a, ok := ctx.Value(attemptKey{}).(*attemptContext)
	if !ok {
		return Event{}, false
	}
	e = Event{Handler: a.c.cfg.Name, Kind: EventAttempt, Attempt: a.n, Delay: a.delay}
	if a.ep != nil {
		a.ep.label(&e) // as EventAttempt says it
	}
	a.c.about(&e)
	return e, true
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
