package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/httpbody"
)

// hedging is a call in its hedging race.
type hedging struct{ *call }

// Hedging, in place of the retry layer: the first attempt goes out, and
// while it has no acceptable outcome another follows after Delay, up to
// MaxHedges more, each with its own request clone, body copy, circuit
// permit, attempt deadline and goroutine. The first acceptable outcome wins;
// a handled failure (what would be retried) never wins while attempts are
// still running, and sends the next hedge at once. The losers are drained
// and closed, then cancelled (settle); the winner's body stays readable.
//
// The call's own context (a child of the request's) is cancelled by the
// total deadline's timer, so it bounds every attempt while the race runs
// (a loser then has bounds of its own: settle) and the winner's body.

// errHedgeLost cancels the attempts that lost the race.
var errHedgeLost = errors.New("resilience: another hedged attempt won")

// The Err of the EventAttempt that reports an attempt still running when
// its call ended (settle): the call returned another's answer
// (errLostRace), or failed on its first attempt's refusal (errCallEnded).
// Both are context.Canceled, as the attempt's own error is once the call
// cancels it, so that observers class them "canceled".
var (
	errLostRace  = fmt.Errorf("%w: %w", errHedgeLost, context.Canceled)
	errCallEnded = fmt.Errorf("resilience: the hedged call ended without this attempt: %w", context.Canceled)
)

// What an attempt of a hedged call came to.
type outcomeKind int

const (
	outcomeFailure   outcomeKind = iota // a handled failure: it does not win
	outcomeWin                          // acceptable: the call is over
	outcomeRejected                     // the circuit refused it; nothing was sent
	outcomeAbandoned                    // cancelled: lost the race, the deadline, or the caller left
	outcomeShed                         // the overload limiter refused it; nothing was sent
)

type hedgeOutcome struct {
	n      int
	resp   *http.Response
	err    error // for outcomeRejected, why the circuit is open
	kind   outcomeKind
	ep     int           // with Endpoints, the index of the attempt's endpoint
	events attemptEvents // what the attempt's goroutine has to report
}

// attemptEvents are the events of the call that an attempt's goroutine
// came to: it keeps them in its outcome (call.record), and the call's loop
// emits them when it receives the outcome, so that only the call's own
// goroutine emits its events and writes its Report. An outcome the loop
// never receives, that of an attempt still running when the call returned,
// is reported by the loop itself as it returns (settle), and its own
// events are dropped. An attempt has at most two: EventOverloadShed alone,
// or EventAttempt and then EventAttemptTimeout or EventPushback.
type attemptEvents struct {
	e [2]Event
	n int
}

func (a *attemptEvents) add(e Event) {
	if a.n < len(a.e) {
		a.e[a.n] = e
		a.n++
	}
}

// emitKept emits the events an attempt's goroutine kept, on the call's
// goroutine.
func (c hedging) emitKept(a *attemptEvents) {
	for i := range a.n {
		c.emit(a.e[i])
	}
}

// A hedgeTarget is where an attempt goes: the request's own host, whose
// circuit the attempt's goroutine asks, or an endpoint, whose circuit the
// call's loop asked when it picked it (admitted).
type hedgeTarget struct {
	s        *hostState
	ep       *endpoint // nil without Endpoints
	idx      int       // the endpoint's index
	probe    uint64
	admitted bool
	claimed  bool // a hedge that follows a failure claimed a retry budget token
}

// A hedgeAttempt is the main goroutine's handle on an attempt. The
// attempt's context carries the call context's values but not its
// cancellation, which reaches it through a link (stop unlinks it): the call
// context ends with the winner's body, and a loser still answering or
// being drained then must not lose its connection (settle).
type hedgeAttempt struct {
	cancel context.CancelCauseFunc
	stop   func() bool // unlinks the attempt from the call context
	done   bool
	delay  time.Duration // as EventAttempt says it
	ep     *endpoint     // nil without Endpoints

	// sent is when the attempt was sent (UnixNano), set by its goroutine
	// just before; the call's loop, ending while it is still running, sets
	// it to notSent first if it can: the attempt is then never sent.
	sent atomic.Int64
}

// notSent marks a hedgeAttempt that its call gave up before it was sent.
const notSent = -1

// detachedAttempt returns the context of an attempt of the call whose
// context is ctx, linked to ctx until stop is called.
func detachedAttempt(ctx context.Context) (actx context.Context, a *hedgeAttempt) {
	actx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	return actx, &hedgeAttempt{cancel: cancel, stop: stop}
}

func (c hedging) hedge(now time.Time) (*http.Response, error) {
	cfg := c.cfg
	if err := c.callerLeft(); err != nil {
		return nil, c.errorf(nil, err, "") // the caller left: say so, not what the circuit would have said
	}
	ctx, cancel := context.WithCancelCause(c.req.Context())
	c.mu.Lock()
	c.cancel, c.inBody = cancel, true // the timer only ever enforces the total deadline here
	c.armLocked(c.totalAt, ErrTotalTimeout, now)
	c.mu.Unlock()

	c.repeatable = (c.keyed && cfg.Idempotency.Hedge) || cfg.methods.repeatable(c.req, c.over)
	if err := c.body.Prepare(c.req, c.repeatable, cfg.MaxBufferedBody); err != nil {
		return nil, c.faulted(err)
	}
	hedges := 0
	if c.repeatable && c.body.Replayable() {
		hedges = cfg.Hedging.MaxHedges
	}
	delay := c.hedgeDelay()
	rt := routing(c).newRoute() // nil without Endpoints
	if rt != nil {
		defer routing(c).routeEnded(rt)
	}
	capped := hedges > 0 && cfg.Hedging.MaxExtraLoad != NoExtraLoadCap
	if capped {
		c.h.load.Call()
	}

	results := make(chan hedgeOutcome, 1+hedges)
	var attempts []*hedgeAttempt
	running := 0
	launch := func(delay time.Duration, claimed bool) error {
		n := len(attempts) + 1
		t := hedgeTarget{s: c.s, claimed: claimed}
		var refused error
		if rt != nil {
			t.ep, t.s, t.probe, refused = routing(c).admitRouted(rt)
			t.idx, t.admitted = rt.last, true
		}
		var body io.ReadCloser
		var getBody func() (io.ReadCloser, error)
		if refused == nil {
			var err error
			if body, getBody, err = c.body.Next(); err != nil {
				if t.admitted {
					t.s.circuit.ReleaseProbe(t.probe)
				}
				return err
			}
		}
		actx, a := detachedAttempt(ctx)
		a.delay, a.ep = delay, t.ep
		attempts = append(attempts, a)
		c.attempts++ // taken back if the circuit refuses it
		running++
		if refused != nil { // every endpoint's circuit refused: nothing to send
			if claimed {
				c.budget().Release()
			}
			results <- hedgeOutcome{n: n, kind: outcomeRejected, err: refused}
			return nil
		}
		go func() {
			results <- c.hedgeAttempt(actx, a, n, delay, body, getBody, t)
		}()
		return nil
	}
	// another sends one more hedge if the rules allow it, and says whether
	// it did; refused says the budget or the cap alone stood in the way, so
	// that the hedge is asked for again at the next hedge point. A hedge sent
	// while an attempt still runs (speculative) needs room under
	// MaxExtraLoad, and nothing of the retry budget: the budget's job is
	// failing retries, and a hedge that follows a failure is one, which
	// claims a token as a retry does. Each refusal is reported once per
	// call, however often the hedge is asked for.
	refused, reported, cappedReported := false, false, false
	mayHedge := func() bool {
		// an open or probing circuit gets no extra load
		return len(attempts) <= hedges && !c.h.isolated.Load() && (rt == nil || rt.left()) && c.s.circuit.Closed()
	}
	refuse := func(why *budget.Refusal) {
		if !reported {
			reported = true
			c.emit(Event{Kind: EventBudgetExceeded, Attempt: len(attempts) + 1, Err: why.Of(nil)})
		}
	}
	another := func(delay time.Duration, speculative bool) bool {
		refused = false
		if !mayHedge() {
			return false
		}
		claimed := false
		if speculative {
			if capped && !c.h.load.Claim(cfg.Hedging.MaxExtraLoad) {
				if !cappedReported {
					cappedReported = true
					c.emit(Event{Kind: EventHedgeCapped, Attempt: len(attempts) + 1, Delay: delay})
				}
				refused = true
				return false
			}
		} else if b := c.budget(); b != nil {
			if why := b.Take(); why != nil {
				refuse(why)
				refused = true
				return false
			}
			claimed = true
		}
		c.emit(Event{Kind: EventHedge, Attempt: len(attempts) + 1, Delay: delay})
		if err := launch(delay, claimed); err != nil {
			if claimed {
				c.budget().Release()
			}
			return false
		}
		return true
	}

	if err := launch(0, false); err != nil {
		return nil, c.faulted(err) // its body could not be had
	}
	var timer *time.Timer
	var tick <-chan time.Time
	if hedges > 0 {
		timer = time.NewTimer(delay)
		defer timer.Stop()
		tick = timer.C
	}

	var last *hedgeOutcome // the latest handled failure, kept until something better comes
	// A failure whose server asked for a wait (a Retry-After) holds the
	// hedge it would send at once until the wait ends (owed, since owedAt),
	// and so does a speculative hedge meanwhile (hedgepause.go).
	var pauses *hedgePauses
	owed, owedAt := false, time.Time{}
	for {
		select {
		case o := <-results:
			running--
			attempts[o.n-1].done = true
			c.emitKept(&o.events)
			switch o.kind {
			case outcomeWin:
				if rt != nil {
					rt.last = o.ep // the endpoint whose answer the caller gets
				}
				c.settle(attempts, results, running, last, true, errLostRace)
				if o.err != nil {
					return nil, c.faulted(o.err) // the request's own failure
				}
				return o.resp, nil
			case outcomeRejected:
				c.attempts-- // never sent
				if o.n == 1 {
					c.settle(attempts, results, running, last, false, errCallEnded)
					if rt != nil { // each endpoint's refusal was reported
						return nil, c.errorf(ErrCircuitOpen, o.err, "on every endpoint")
					}
					return nil, reporting(c).rejected(o.err)
				}
				if rt == nil {
					c.emit(Event{Kind: EventCircuitRejected, Attempt: o.n, Err: o.err})
				}
			case outcomeShed:
				c.attempts-- // never sent
				if o.n == 1 {
					c.settle(attempts, results, running, last, false, errCallEnded)
					return nil, sending(c).overloadFailure(o.err)
				}
			case outcomeFailure:
				if rt != nil {
					rt.ended(o.ep, o.err) // an endpoint's own failure drops it from the call
				}
				if last != nil {
					a := attempts[last.n-1]
					a.stop()
					go c.discardLoser(a, last) // never keep the next outcome waiting on a loser
				}
				last = &o
				pauses = c.heed(pauses, rt, &o)
				now := time.Now()
				if pause, ok := pauses.wait(rt, c.h, now); !ok || (pause > 0 && !mayHedge()) {
					owed = false // no hedge may go: the attempts running, if any, have the last word
				} else if pause > 0 {
					if why := c.budget().Refuses(); why != nil && running == 0 {
						refuse(why) // nothing to wait for: answer now, as a retry would
					} else {
						if !owed {
							owed, owedAt = true, now
						}
						timer.Reset(pause)
						continue
					}
				} else if another(0, false) || refused {
					if timer != nil {
						timer.Reset(delay)
					}
					if !refused {
						continue
					}
				}
			}
			if running == 0 && last != nil {
				// Every attempt failed: the call ends on a failure the retry
				// layer retries (Report.Outcome).
				c.retryable = true
				return retryLoop(c).result(last.resp, last.err)
			}
		case <-tick:
			now := time.Now()
			pause, ok := pauses.wait(rt, c.h, now)
			switch {
			case !ok:
				owed = false
			case pause > 0:
				timer.Reset(pause) // the server the hedge would go to asked for a wait
				continue
			default:
				d, speculative := delay, running > 0 && !owed
				if owed {
					d = now.Sub(owedAt) // a failure's hedge, held for a Retry-After
				}
				owed = false
				if another(d, speculative) || refused {
					timer.Reset(delay) // a refused hedge is asked for again later
				}
			}
			if running == 0 && last != nil {
				c.retryable = true // no hedge went: the call ends on a failure, as above
				return retryLoop(c).result(last.resp, last.err)
			}
		case <-ctx.Done():
			c.settle(attempts, results, running, last, false, context.Cause(ctx)) // the total timeout, or the caller's cause
			if context.Cause(ctx) == ErrTotalTimeout {
				return nil, reporting(c).totalTimeout(nil)
			}
			return nil, c.errorf(nil, c.req.Context().Err(), "")
		}
	}
}

// hedgeAttempt is one attempt of a hedged call, a's, in its own goroutine:
// under the circuit breaker and the attempt deadline, on its own context.
// It touches nothing of the call that the main goroutine writes, and
// emits nothing: the events it comes to go back in its outcome.
func (c hedging) hedgeAttempt(ctx context.Context, a *hedgeAttempt, n int, delay time.Duration, body io.ReadCloser, getBody func() (io.ReadCloser, error), t hedgeTarget) (o hedgeOutcome) {
	var rec attemptEvents
	defer func() { o.events = rec }()
	cancel := a.cancel
	// A hedge that follows a failure claimed a budget token; an outcome that
	// is not judged settles the claim here. The retry budget counts the
	// first attempt and those hedges, not the speculative ones.
	settle := func() {
		if t.claimed {
			c.budget().Release()
		}
	}
	var rb *budget.Budget
	if n == 1 || t.claimed {
		rb = c.budget()
	}
	unsent := func() {
		settle()
		if body != nil {
			body.Close() // RoundTrip closes the bodies it sends, and only those
		}
	}
	s, probe := t.s, t.probe
	if !t.admitted {
		if c.h.isolated.Load() {
			unsent()
			return hedgeOutcome{n: n, kind: outcomeRejected, err: ErrIsolated}
		}
		var reason error
		if probe, reason = s.circuit.Admit(); reason != nil {
			unsent()
			return hedgeOutcome{n: n, kind: outcomeRejected, err: reason}
		}
	}
	slot, err := sending(c).takeSlot(ctx, s, n, n == 1, time.Now(), &rec) // the first waits; a hedge only tries
	if err != nil {
		unsent()
		s.circuit.ReleaseProbe(probe)
		return hedgeOutcome{n: n, kind: outcomeShed, err: err}
	}
	start := time.Now()
	if !a.sent.CompareAndSwap(0, start.UnixNano()) { // the call ended while it waited: never sent
		unsent()
		slot.release(overloadDropped)
		s.circuit.ReleaseProbe(probe)
		return hedgeOutcome{n: n, kind: outcomeAbandoned}
	}
	var deadline *time.Timer
	if d := c.attemptLimit; d > 0 {
		deadline = time.AfterFunc(d, func() { cancel(ErrAttemptTimeout) })
	}
	r, sent := sending(c).attemptRequest(ctx, n, delay, t.ep, body, getBody)
	if t.ep != nil {
		t.ep.retarget(r)
	}
	sentAt := sending(c).sendingAttempt(n)
	resp, err := c.base.RoundTrip(r)
	sending(c).attemptAnswered(sentAt, resp)
	if deadline != nil {
		deadline.Stop()
	}
	cause := context.Cause(ctx)
	if err == nil && cause != ErrAttemptTimeout {
		cause = nil // headers came; a later cancellation is the race's or the caller's
	}
	var cutBy error // as the sequential path reports it: our deadlines, not the race
	if cause == ErrAttemptTimeout || cause == ErrTotalTimeout {
		cutBy = cause
	}
	if slot.l != nil {
		o := sending(c).overloadOutcome(resp, err, cutBy)
		if cause != nil && cutBy == nil {
			o = overloadDropped // the race's loser
		}
		if o == overloadLoss && requestFault(sent, err) != nil {
			o = overloadDropped
		}
		slot.release(o)
	}
	reporting(c).attemptEnded(n, start, delay, resp, err, cutBy, t.ep, &rec)
	if c.cfg.Hedging.DelayPercentile > 0 && (cause == nil || cause == ErrAttemptTimeout) {
		c.h.latency.Record(time.Since(start)) // not a loser cut short: it says nothing of the latency
	}
	switch {
	case cause == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		e := Event{Kind: EventAttemptTimeout, Attempt: n, Err: ErrAttemptTimeout}
		if t.ep != nil {
			t.ep.label(&e)
		}
		rec.add(e)
		sending(c).judge(s, n == 1, rb, nil, ErrAttemptTimeout, &rec)
		return hedgeOutcome{n: n, err: ErrAttemptTimeout, kind: outcomeFailure, ep: t.idx}
	case cause != nil || (err != nil && c.callerLeft() != nil):
		settle()
		s.abandonProbe(probe, err) // the race's loser or the caller gave up
		return hedgeOutcome{n: n, err: err, kind: outcomeAbandoned, ep: t.idx}
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			settle()
			s.circuit.ReleaseProbe(probe) // the request's own failure ends the call
			return hedgeOutcome{n: n, err: fault, kind: outcomeWin, ep: t.idx}
		}
	}
	if sending(c).judge(s, n == 1, rb, resp, err, &rec) && !(err == nil && resp.StatusCode == http.StatusSwitchingProtocols) {
		return hedgeOutcome{n: n, resp: resp, err: err, kind: outcomeFailure, ep: t.idx}
	}
	return hedgeOutcome{n: n, resp: resp, err: err, kind: outcomeWin, ep: t.idx}
}

// settle ends the race: the attempts that lost, and the kept failure, are
// drained and closed in the background, and the winner, if any, never
// waits for them. With grace (the call has its answer), each loser is
// unlinked from the call context, whose end (the winner's body closed)
// would otherwise cancel it mid-response and close its connection: a loser
// still waiting for its headers has httpbody.MaxDrainTime to get them, its body is
// drained as a retried response's is, bounded, and only then is its context
// cancelled. Without grace (the deadline passed, or the caller left) the
// attempts still running are cancelled at once.
//
// settle runs on the call's goroutine, as the call ends: what the attempts
// still running come to is never reported, since the caller has its answer
// by then. Each one already sent is reported now, an EventAttempt whose Err
// is why the call no longer waits for it (why: errLostRace, the total
// timeout, the caller's cause); one not yet sent (a first attempt still
// queued for an overload slot) never will be, and is not counted.
func (c hedging) settle(attempts []*hedgeAttempt, results <-chan hedgeOutcome, running int, last *hedgeOutcome, grace bool, why error) {
	for i, a := range attempts {
		if a.done {
			continue
		}
		if a.sent.CompareAndSwap(0, notSent) {
			c.attempts--
			a.cancel(errHedgeLost) // not waited for: it stops waiting for its slot
			continue
		}
		if grace {
			a.stop()
		} else {
			a.cancel(errHedgeLost)
		}
		if c.cfg.observed() {
			e := Event{Kind: EventAttempt, Attempt: i + 1, Delay: a.delay, Duration: time.Since(time.Unix(0, a.sent.Load())), Err: why}
			if a.ep != nil {
				a.ep.label(&e)
			}
			c.emit(e)
		}
	}
	var kept *hedgeAttempt
	if last != nil {
		kept = attempts[last.n-1]
		kept.stop()
	}
	if last == nil && running == 0 {
		return
	}
	go func() {
		if last != nil {
			c.discardLoser(kept, last)
		}
		var expired <-chan time.Time
		if grace && running > 0 {
			t := time.NewTimer(httpbody.MaxDrainTime)
			defer t.Stop()
			expired = t.C
		}
		for running > 0 {
			select {
			case o := <-results:
				running--
				a := attempts[o.n-1]
				a.done = true
				c.discardLoser(a, &o)
			case <-expired:
				expired = nil
				for _, a := range attempts {
					if !a.done {
						a.cancel(errHedgeLost)
					}
				}
			}
		}
	}()
}

// discardLoser discards the outcome of attempt a, which lost, and then
// cancels a's context: a response is drained before its connection could
// be closed under it.
func (c hedging) discardLoser(a *hedgeAttempt, o *hedgeOutcome) {
	c.discardOutcome(o)
	a.cancel(errHedgeLost)
}

// discardOutcome drains and closes a response that lost, bounded in bytes
// like a retried one and in time by closing it when httpbody.MaxDrainTime passes.
func (c hedging) discardOutcome(o *hedgeOutcome) {
	if o.resp != nil {
		t := time.AfterFunc(httpbody.MaxDrainTime, func() { o.resp.Body.Close() })
		httpbody.Drain(o.resp)
		t.Stop()
	}
}
