package resilience

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// Hedging, in place of the retry layer: the first attempt goes out, and
// while it has no acceptable outcome another follows after Delay, up to
// MaxHedges more, each with its own request clone, body copy, circuit
// permit, attempt deadline and goroutine. The first acceptable outcome wins;
// a handled failure (what would be retried) never wins while attempts are
// still running, and sends the next hedge at once. The losers are cancelled,
// their responses drained and closed; the winner's body stays readable.
//
// The call's own context (a child of the request's) is cancelled by the
// total deadline's timer, so it bounds every attempt and the winner's body.

// errHedgeLost cancels the attempts that lost the race.
var errHedgeLost = errors.New("resilience: another hedged attempt won")

// What an attempt of a hedged call came to.
type outcomeKind int

const (
	outcomeFailure   outcomeKind = iota // a handled failure: it does not win
	outcomeWin                          // acceptable: the call is over
	outcomeRejected                     // the circuit refused it; nothing was sent
	outcomeAbandoned                    // cancelled: lost the race, the deadline, or the caller left
)

type hedgeOutcome struct {
	n    int
	resp *http.Response
	err  error // for outcomeRejected, why the circuit is open
	kind outcomeKind
}

type hedgeAttempt struct {
	cancel context.CancelCauseFunc
	done   bool
}

func (c *call) hedge(now time.Time) (*http.Response, error) {
	cfg := c.cfg
	if err := c.callerLeft(); err != nil {
		return nil, c.errorf(nil, err, "") // the caller left: say so, not what the circuit would have said
	}
	ctx, cancel := context.WithCancelCause(c.req.Context())
	c.mu.Lock()
	c.cancel, c.inBody = cancel, true // the timer only ever enforces the total deadline here
	c.armLocked(c.totalAt, ErrTotalTimeout, now)
	c.mu.Unlock()

	c.repeatable = cfg.methods.repeatable(c.req, c.over)
	if err := c.body.prepare(c.req, c.repeatable, cfg.MaxBufferedBody); err != nil {
		return nil, c.errorf(nil, err, "")
	}
	hedges := 0
	if c.repeatable && c.body.replayable() {
		hedges = cfg.Hedging.MaxHedges
	}

	results := make(chan hedgeOutcome, 1+hedges)
	var attempts []*hedgeAttempt
	running := 0
	launch := func(delay time.Duration) error {
		body, getBody, err := c.body.next()
		if err != nil {
			return err
		}
		n := len(attempts) + 1
		actx, acancel := context.WithCancelCause(ctx)
		attempts = append(attempts, &hedgeAttempt{cancel: acancel})
		c.attempts++ // taken back if the circuit refuses it
		running++
		go func() {
			results <- c.hedgeAttempt(actx, acancel, n, delay, body, getBody)
		}()
		return nil
	}
	// another sends one more hedge if the rules allow it, and says whether
	// it did; refused says the budget alone stood in the way, so that the
	// hedge is asked for again at the next hedge point. The budget's refusal
	// is reported once per call, however often the hedge is asked for.
	refused, reported := false, false
	another := func(delay time.Duration) bool {
		refused = false
		if len(attempts) > hedges || c.h.isolated.Load() {
			return false
		}
		if c.s.breaker() != nil && c.s.circuit.Load() != int32(CircuitClosed) {
			return false // an open or probing circuit gets no extra load
		}
		if b := c.budget(); b != nil && !b.claim() {
			if !reported {
				reported = true
				c.emit(Event{Kind: EventBudgetExceeded, Attempt: len(attempts) + 1, Err: b.refusal(nil)})
			}
			refused = true
			return false
		}
		c.emit(Event{Kind: EventHedge, Attempt: len(attempts) + 1, Delay: delay})
		if err := launch(delay); err != nil {
			if b := c.budget(); b != nil {
				b.release()
			}
			return false
		}
		return true
	}

	if err := launch(0); err != nil {
		return nil, c.errorf(nil, err, "")
	}
	var timer *time.Timer
	var tick <-chan time.Time
	if hedges > 0 {
		timer = time.NewTimer(cfg.Hedging.Delay)
		defer timer.Stop()
		tick = timer.C
	}

	var last *hedgeOutcome // the latest handled failure, kept until something better comes
	for {
		select {
		case o := <-results:
			running--
			attempts[o.n-1].done = true
			switch o.kind {
			case outcomeWin:
				c.settle(attempts, results, running, last)
				if o.err != nil {
					return nil, c.errorf(nil, o.err, "")
				}
				return o.resp, nil
			case outcomeRejected:
				c.attempts-- // never sent
				if o.n == 1 {
					c.settle(attempts, results, running, last)
					return nil, c.rejected(o.err)
				}
				c.emit(Event{Kind: EventCircuitRejected, Attempt: o.n, Err: o.err})
			case outcomeFailure:
				if last != nil {
					go c.discardOutcome(last) // never keep the next outcome waiting on a loser
				}
				last = &o
				if another(0) || refused {
					if timer != nil {
						timer.Reset(cfg.Hedging.Delay)
					}
					if !refused {
						continue
					}
				}
			}
			if running == 0 && last != nil {
				return c.result(last.resp, last.err) // every attempt failed
			}
		case <-tick:
			if another(cfg.Hedging.Delay) || refused {
				timer.Reset(cfg.Hedging.Delay) // a refused hedge is asked for again later
			}
		case <-ctx.Done():
			c.settle(attempts, results, running, last)
			if context.Cause(ctx) == ErrTotalTimeout {
				return nil, c.totalTimeout(nil)
			}
			return nil, c.errorf(nil, c.req.Context().Err(), "")
		}
	}
}

// hedgeAttempt is one attempt of a hedged call, in its own goroutine: under
// the circuit breaker and the attempt deadline, on its own context. It
// touches nothing of the call that the main goroutine writes.
func (c *call) hedgeAttempt(ctx context.Context, cancel context.CancelCauseFunc, n int, delay time.Duration, body io.ReadCloser, getBody func() (io.ReadCloser, error)) hedgeOutcome {
	// A hedge (n > 1) claimed a budget token; an outcome that is not
	// judged settles the claim here.
	settle := func() {
		if n > 1 && c.budget() != nil {
			c.budget().release()
		}
	}
	unsent := func() {
		settle()
		if body != nil {
			body.Close() // RoundTrip closes the bodies it sends, and only those
		}
	}
	if c.h.isolated.Load() {
		unsent()
		return hedgeOutcome{n: n, kind: outcomeRejected, err: ErrIsolated}
	}
	probe, reason := c.s.admit()
	if reason != nil {
		unsent()
		return hedgeOutcome{n: n, kind: outcomeRejected, err: reason}
	}
	var deadline *time.Timer
	if d := c.attemptLimit; d > 0 {
		deadline = time.AfterFunc(d, func() { cancel(ErrAttemptTimeout) })
	}
	start := time.Now()
	r, sent := c.attemptRequest(ctx, body, getBody)
	sentAt := c.sendingAttempt(n)
	resp, err := c.base.RoundTrip(r)
	c.attemptAnswered(sentAt, resp)
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
	c.attemptEnded(n, start, delay, resp, err, cutBy)
	switch {
	case cause == ErrAttemptTimeout:
		if resp != nil {
			resp.Body.Close()
		}
		c.emit(Event{Kind: EventAttemptTimeout, Attempt: n, Err: ErrAttemptTimeout})
		c.judge(n == 1, nil, ErrAttemptTimeout)
		return hedgeOutcome{n: n, err: ErrAttemptTimeout, kind: outcomeFailure}
	case cause != nil || (err != nil && c.callerLeft() != nil):
		settle()
		c.s.abandonProbe(probe, err) // the race's loser or the caller gave up
		return hedgeOutcome{n: n, err: err, kind: outcomeAbandoned}
	case err != nil:
		if fault := requestFault(sent, err); fault != nil {
			settle()
			c.s.releaseProbe(probe) // the request's own failure ends the call
			return hedgeOutcome{n: n, err: fault, kind: outcomeWin}
		}
	}
	if c.judge(n == 1, resp, err) && !(err == nil && resp.StatusCode == http.StatusSwitchingProtocols) {
		return hedgeOutcome{n: n, resp: resp, err: err, kind: outcomeFailure}
	}
	return hedgeOutcome{n: n, resp: resp, err: err, kind: outcomeWin}
}

// settle cancels the attempts still running and, in the background, drains
// and closes what they return, and the kept failure too: the winner, if
// any, is not among them and never waits for them.
func (c *call) settle(attempts []*hedgeAttempt, results <-chan hedgeOutcome, running int, last *hedgeOutcome) {
	for _, a := range attempts {
		if !a.done {
			a.cancel(errHedgeLost)
		}
	}
	if last == nil && running == 0 {
		return
	}
	go func() {
		if last != nil {
			c.discardOutcome(last)
		}
		for ; running > 0; running-- {
			o := <-results
			c.discardOutcome(&o)
		}
	}()
}

// discardOutcome drains and closes a response that lost, bounded in bytes
// like a retried one and in time by closing it when maxDrainTime passes.
func (c *call) discardOutcome(o *hedgeOutcome) {
	if o.resp != nil {
		t := time.AfterFunc(maxDrainTime, func() { o.resp.Body.Close() })
		drain(o.resp)
		t.Stop()
	}
}
