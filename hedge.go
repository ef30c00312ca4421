package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/httpbody"
)

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

// A hedge is one attempt of a hedging race, sent on a goroutine of its own:
// the attempt, and the race's handle on it. Its context carries the call
// context's values but not its cancellation, which reaches it through a
// link (stop unlinks it): the call context ends with the winner's body, and
// a loser still answering or being drained then must not lose its
// connection (settle). Its goroutine writes out and events, and the race
// reads them once it receives the hedge from its results.
type hedge struct {
	attempt
	own    deadlines     // its attempt deadline
	events attemptEvents // what its goroutine came to, for the race to emit
	out    outcome
	stop   func() bool // unlinks it from the call context
	done   bool        // the race received it
}

// A race is a hedged call's loop, on the call's goroutine: it sends the
// hedges, receives their outcomes and ends the race.
type race struct {
	c       *call
	ctx     context.Context // the call's context of the race, which the total deadline cancels
	rt      *route          // nil without Endpoints
	hedges  int             // the most hedges after the first attempt
	delay   time.Duration   // between hedges
	capped  bool            // a speculative hedge needs room under MaxExtraLoad
	results chan *hedge
	sent    []*hedge // every attempt, in the order launched
	sends   sends    // numbers them as they are sent
	running int
	last    *hedge // the latest handled failure, kept until something better comes

	// A failure whose server asked for a wait (a Retry-After) holds the
	// hedge it would send at once until the wait ends (owed, since owedAt),
	// and so does a speculative hedge meanwhile (hedgepause.go).
	pauses *hedgePauses
	owed   bool
	owedAt time.Time

	refused        bool // the budget or the cap alone stood in the way of the last hedge asked for
	reported       bool // the budget's refusal was reported
	cappedReported bool // the cap's refusal was reported
}

// hedge runs the call's hedging race from now, in place of the retry loop.
func (c *call) hedge(now time.Time) (*http.Response, error) {
	cfg := c.cfg
	if err := c.callerLeft(); err != nil {
		return nil, c.errorf(nil, err, "") // the caller left: say so, not what the circuit would have said
	}
	ctx, cancel := context.WithCancelCause(c.req.Context())
	c.mu.Lock()
	c.cancel, c.inBody = cancel, true // the timer only ever enforces the total deadline here
	c.armLocked(c.totalAt, totalCause, now)
	c.mu.Unlock()

	c.repeatable = (c.keyed && cfg.Idempotency.Hedge) || cfg.methods.repeatable(c.req, c.over)
	if err := c.body.Prepare(c.req, c.repeatable, cfg.MaxBufferedBody); err != nil {
		return nil, c.faulted(err)
	}
	r := &race{c: c, ctx: ctx, delay: c.hedgeDelay()}
	if c.cfg.route != nil {
		r.rt = &route{r: c.cfg.route}
	}
	if r.rt != nil {
		defer c.routeEnded(r.rt)
	}
	if c.repeatable && c.body.Replayable() {
		r.hedges = cfg.Hedging.MaxHedges
	}
	r.capped = r.hedges > 0 && cfg.Hedging.MaxExtraLoad != NoExtraLoadCap
	if r.capped {
		c.h.load.Call()
	}
	r.results = make(chan *hedge, 1+r.hedges)
	return r.run()
}

// hedgeDelay returns how long an attempt of a call runs before the next is
// sent: Hedging.Delay, or with DelayPercentile, that percentile of the
// recent attempts within [MinDelay, MaxDelay] (Delay until enough attempts
// have been seen).
func (c *call) hedgeDelay() time.Duration {
	hg := &c.cfg.Hedging
	if hg.DelayPercentile == 0 {
		return hg.Delay
	}
	d, ok := c.h.latency.Percentile(hg.DelayPercentile)
	if !ok {
		return hg.Delay
	}
	return min(hg.MaxDelay, max(hg.MinDelay, d))
}

// launch sends the race's next attempt, after delay, on a goroutine of its
// own; claimed says it holds a retry budget token (a hedge that follows a
// failure), speculative that it is sent while an attempt still runs. It
// fails only when the request's body cannot be had.
func (r *race) launch(delay time.Duration, claimed, speculative bool) error {
	c := r.c
	first := len(r.sent) == 0
	h := &hedge{}
	// Its number until it is sent (sends.commit): the next, if the attempts
	// still running were all sent; 1 for the call's first attempt alone.
	n := int(c.attempts) + 1
	h.attempt = attempt{c: c, n: n, delay: delay, s: c.s, queue: first, hedge: speculative, first: first, claimed: claimed}
	if first || claimed {
		h.rb = c.budget() // the budget counts the first attempt and the hedges that follow a failure
	}
	var refused error
	if r.rt != nil {
		refused = c.admitRouted(r.rt, &h.attempt)
	}
	if refused == nil {
		var err error
		if h.body, h.getBody, err = c.body.Next(); err != nil {
			if h.admitted {
				h.s.circuit.ReleaseProbe(h.probe)
			}
			return err
		}
	}
	h.ctx, h.cancel = context.WithCancelCause(context.WithoutCancel(r.ctx))
	h.stop = context.AfterFunc(r.ctx, func() { h.cancel(context.Cause(r.ctx)) })
	h.own.owner = c
	h.dl, h.rec, h.race = &h.own, &h.events, &r.sends
	r.sent = append(r.sent, h)
	c.attempts++ // taken back if it is not sent
	r.running++
	if refused != nil { // every endpoint's circuit refused: nothing to send
		h.settle()
		h.out = outcome{kind: outcomeRejected, err: refused}
		r.results <- h
		return nil
	}
	go func() {
		h.out = h.send(time.Now())
		r.results <- h
	}()
	return nil
}

// mayHedge reports whether another hedge may go: one is left, the handler
// is not isolated, an endpoint is left, and the circuit is closed (an open
// or probing circuit gets no extra load).
func (r *race) mayHedge() bool {
	c := r.c
	return len(r.sent) <= r.hedges && !c.h.isolated.Load() && (r.rt == nil || r.rt.left()) && c.s.circuit.Closed()
}

// refuse reports the budget's refusal of a hedge, once per call.
func (r *race) refuse(why *budget.Refusal) {
	if !r.reported {
		r.reported = true
		r.c.emit(Event{Kind: EventBudgetExceeded, Attempt: int(r.c.attempts) + 1, Err: why.Of(nil)})
	}
}

// another sends one more hedge if the rules allow it, and says whether it
// did; r.refused says the budget or the cap alone stood in the way, so that
// the hedge is asked for again at the next hedge point. A hedge sent while
// an attempt still runs (speculative) needs room under MaxExtraLoad, and
// nothing of the retry budget: the budget's job is failing retries, and a
// hedge that follows a failure is one, which claims a token as a retry
// does. Each refusal is reported once per call, however often the hedge is
// asked for.
func (r *race) another(delay time.Duration, speculative bool) bool {
	c := r.c
	r.refused = false
	if !r.mayHedge() {
		return false
	}
	claimed := false
	if speculative {
		if r.capped && !c.h.load.Claim(c.cfg.Hedging.MaxExtraLoad) {
			if !r.cappedReported {
				r.cappedReported = true
				c.emit(Event{Kind: EventHedgeCapped, Attempt: int(c.attempts) + 1, Delay: delay})
			}
			r.refused = true
			return false
		}
	} else if b := c.budget(); b != nil {
		if why := b.Take(); why != nil {
			r.refuse(why)
			r.refused = true
			return false
		}
		claimed = true
	}
	c.emit(Event{Kind: EventHedge, Attempt: int(c.attempts) + 1, Delay: delay})
	if err := r.launch(delay, claimed, speculative); err != nil {
		if claimed {
			c.budget().Release()
		}
		return false
	}
	return true
}

// run is the race: the first attempt goes now, and the race ends on the
// first acceptable outcome, on every attempt failing, or on the call's
// context.
func (r *race) run() (*http.Response, error) {
	c := r.c
	if err := r.launch(0, false, false); err != nil {
		return nil, c.faulted(err) // its body could not be had
	}
	var timer *time.Timer
	var tick <-chan time.Time
	if r.hedges > 0 {
		timer = time.NewTimer(r.delay)
		defer timer.Stop()
		tick = timer.C
	}
	for {
		select {
		case h := <-r.results:
			r.running--
			h.done = true
			for i := range h.events.n {
				c.emit(h.events.e[i])
			}
			o := &h.out
			if o.kind == outcomeFault || o.kind == outcomeAnswer {
				r.settle(true, errLostRace)
				if r.rt != nil {
					r.rt.last = h.idx // the endpoint whose answer the caller gets
				}
				if o.kind == outcomeFault {
					return nil, c.faulted(o.err) // the request's own failure
				}
				return c.result(o.resp, o.err)
			}
			switch o.kind {
			case outcomeRejected:
				c.attempts-- // never sent
				if h.first {
					r.settle(false, errCallEnded)
					if r.rt != nil { // each endpoint's refusal was reported
						return nil, c.errorf(ErrCircuitOpen, o.err, "on every endpoint")
					}
					return nil, c.rejected(o.err)
				}
				if r.rt == nil {
					c.emit(Event{Kind: EventCircuitRejected, Attempt: h.n, Err: o.err})
				}
			case outcomeShed:
				c.attempts-- // never sent
				if h.first {
					r.settle(false, errCallEnded)
					return nil, c.overloadFailure(o.err)
				}
			case outcomeFailure:
				if r.rt != nil {
					// the latest sent; an endpoint's own failure drops it from the call
					r.rt.last = h.idx
					r.rt.ended(h.idx, o.err)
				}
				if r.last != nil {
					l := r.last
					l.stop()
					go l.discard() // never keep the next outcome waiting on a loser
				}
				r.last = h
				r.pauses = c.heed(r.pauses, r.rt, h)
				now := time.Now()
				if pause, ok := r.pauses.wait(r.rt, c.h, now); !ok || (pause > 0 && !r.mayHedge()) {
					r.owed = false // no hedge may go: the attempts running, if any, have the last word
				} else if pause > 0 {
					if why := c.budget().Refuses(); why != nil && r.running == 0 {
						r.refuse(why) // nothing to wait for: answer now, as a retry would
					} else {
						if !r.owed {
							r.owed, r.owedAt = true, now
						}
						timer.Reset(pause)
						continue
					}
				} else if r.another(0, false) || r.refused {
					if timer != nil {
						timer.Reset(r.delay)
					}
					if !r.refused {
						continue
					}
				}
			}
			if r.running == 0 && r.last != nil {
				// Every attempt failed: the call ends on a failure the retry
				// layer retries (Report.Outcome).
				return r.lastFailure()
			}
		case <-tick:
			now := time.Now()
			pause, ok := r.pauses.wait(r.rt, c.h, now)
			switch {
			case !ok:
				r.owed = false
			case pause > 0:
				timer.Reset(pause) // the server the hedge would go to asked for a wait
				continue
			default:
				d, speculative := r.delay, r.running > 0 && !r.owed
				if r.owed {
					d = now.Sub(r.owedAt) // a failure's hedge, held for a Retry-After
				}
				r.owed = false
				if r.another(d, speculative) || r.refused {
					timer.Reset(r.delay) // a refused hedge is asked for again later
				}
			}
			if r.running == 0 && r.last != nil {
				return r.lastFailure() // no hedge went: the call ends on a failure, as above
			}
		case <-r.ctx.Done():
			r.settle(false, context.Cause(r.ctx)) // the total timeout, or the caller's cause
			if context.Cause(r.ctx) == ErrTotalTimeout {
				return nil, c.totalTimeout(nil)
			}
			return nil, c.errorf(nil, c.req.Context().Err(), "")
		}
	}
}

// lastFailure ends the race on its latest failure, every attempt having
// ended: the call's answer is that failure, from its endpoint, whatever
// was launched after it and never sent.
func (r *race) lastFailure() (*http.Response, error) {
	if r.rt != nil {
		r.rt.last = r.last.idx
	}
	r.c.retryable = true
	return r.c.result(r.last.out.resp, r.last.out.err)
}

// settle ends the race: the attempts that lost, and the kept failure, are
// drained and closed in the background, and the winner, if any, never
// waits for them. With grace (the call has its answer), each loser is
// unlinked from the call context, whose end (the winner's body closed)
// would otherwise cancel it mid-response and close its connection: a loser
// still waiting for its headers has httpbody.MaxDrainTime to get them, its
// body is drained as a retried response's is, bounded, and only then is its
// context cancelled. Without grace (the deadline passed, or the caller
// left) the attempts still running are cancelled at once.
//
// settle runs on the call's goroutine, as the call ends: what the attempts
// still running come to is never reported, since the caller has its answer
// by then. Each one already sent is reported now, an EventAttempt whose Err
// is why the call no longer waits for it (why: errLostRace, the total
// timeout, the caller's cause); one not yet sent (a first attempt still
// queued for an overload slot) never will be, and is not counted.
func (r *race) settle(grace bool, why error) {
	c := r.c
	r.sends.end()
	for _, h := range r.sent {
		if h.done {
			continue
		}
		if h.sentAt == 0 {
			c.attempts--
			h.cancel(errHedgeLost) // not waited for: it stops waiting for its slot
			continue
		}
		if r.rt != nil {
			r.rt.last = h.idx // the latest sent, unless the call has an answer (run)
		}
		if grace {
			h.stop()
		} else {
			h.cancel(errHedgeLost)
		}
		if c.cfg.observed {
			e := Event{Kind: EventAttempt, Attempt: h.n, Delay: h.delay, Duration: time.Since(time.Unix(0, h.sentAt)), Err: why}
			if h.ep != nil {
				h.ep.label(&e)
			}
			c.emit(e)
		}
	}
	last, running, results := r.last, r.running, r.results
	if last != nil {
		last.stop()
	}
	if last == nil && running == 0 {
		return
	}
	go func() {
		if last != nil {
			last.discard()
		}
		var expired <-chan time.Time
		if grace && running > 0 {
			t := time.NewTimer(httpbody.MaxDrainTime)
			defer t.Stop()
			expired = t.C
		}
		for running > 0 {
			select {
			case h := <-results:
				running--
				h.done = true
				h.discard()
			case <-expired:
				expired = nil
				for _, h := range r.sent {
					if !h.done {
						h.cancel(errHedgeLost)
					}
				}
			}
		}
	}()
}

// sends numbers a race's attempts in the order they are sent, and stops
// the sending when the race ends. A hedge takes its number only once
// nothing stops it being sent (commit): one shed or refused before takes
// none, so that the numbers of the attempts sent (in their events,
// AttemptFromContext and the propagated attempt header) run from 1 without
// a gap, and the last is the call's count, however the hedges' goroutines
// interleave. A mutex, not an atomic counter: the race's end must find
// each hedge either sent, with its number, or never to be sent.
type sends struct {
	mu    sync.Mutex
	n     int  // the attempts sent
	ended bool // the race ended: nothing more is sent
}

// commit numbers a, a hedge about to be sent at now, as the next attempt
// sent, and reports whether it may go: not once the race has ended.
func (s *sends) commit(a *attempt, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	s.n++
	a.n, a.sentAt = s.n, now.UnixNano()
	return true
}

// end ends the race's sending: a hedge not sent by now never is, and one
// sent has its number and sentAt.
func (s *sends) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

// discard discards the outcome of a hedge that lost, and then cancels its
// context: a response is drained, bounded in bytes like a retried one and
// in time by closing it when httpbody.MaxDrainTime passes, before its
// connection could be closed under it.
func (h *hedge) discard() {
	if resp := h.out.resp; resp != nil {
		t := time.AfterFunc(httpbody.MaxDrainTime, func() { resp.Body.Close() })
		httpbody.Drain(resp)
		t.Stop()
	}
	h.cancel(errHedgeLost)
}
