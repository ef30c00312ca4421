package resilience

import (
	"context"
	"sync"
	"time"
)

// One timer enforces a call's deadlines, and one an attempt's that runs
// beside others (a hedge): each is a deadlines, armed when an attempt is
// sent (start). While an attempt waits for its headers the timer is armed
// for the earlier of the attempt and total deadlines; when it fires it
// cancels the attempt's context with the deadline's sentinel as the cause.
// Once headers arrive only the total deadline applies, but the timer is not
// re-armed then: the success path stays cheap, and if the attempt deadline
// fires during the body it simply re-arms for the total deadline. A retried
// response drains under a short bound of its own (body.go).

// deadlines are the deadlines of the attempt being sent: the call's own
// (call.deadlines), which its sequential attempts and then its delivered
// body share, or a hedge's, which has only the attempt deadline (the race's
// context brings the total one). mu guards the fields below it.
type deadlines struct {
	owner   *call     // whose timer slots it lends, and whose body its total deadline ends once delivered
	totalAt time.Time // the total deadline; zero for none

	mu         sync.Mutex
	timer      *timerSlot
	armedAt    time.Time
	cancel     context.CancelCauseFunc // the current attempt's
	sent       time.Duration           // when the current attempt was sent, since the handler's epoch
	armedCause cause                   // what the timer cancels with; none when disarmed
	fired      cause                   // what the timer cancelled the current attempt with
	inBody     bool                    // the current attempt's headers arrived in time
	delivered  bool                    // the caller holds the body: the total timeout ends the call
	held       bool                    // the current attempt outlived its limit, queued behind others (fire)
	afterCut   bool                    // the current attempt is the call's last, and follows one cut at its limit
	unanswered bool                    // the current attempt's upstream had never answered when it was sent
}

// A cause is the deadline the timer cancels an attempt for: a byte rather
// than its error, which keeps a call in its allocation size class.
type cause uint8

const (
	noCause      cause = iota
	attemptCause       // ErrAttemptTimeout
	totalCause         // ErrTotalTimeout
	drainCause         // errDrainTimeout
)

// err is the error the attempt's context is cancelled with; nil for none.
func (c cause) err() error {
	switch c {
	case attemptCause:
		return ErrAttemptTimeout
	case totalCause:
		return ErrTotalTimeout
	case drainCause:
		return errDrainTimeout
	}
	return nil
}

// A timerSlot is a reusable timer whose function is bound once, to the slot;
// the slot points at the deadlines it serves. Handlers keep the free ones
// (timerSlots), which saves a timer and a closure per call.
//
// A slot's timer is left running when its deadlines end or disarm it, and
// is reset only to fire earlier than it will: deadlines later than a
// pending firing are woken at that firing, find their own not yet passed
// and arm the timer again (fire). On the success path a
// call then neither resets nor stops the runtime's timer, which took a
// fifth of the handler's own time (bench/results/overhead-issue20.md): with
// the default 10 s attempt timeout, a slot's timer fires once per 10 s
// however many calls it serves.
type timerSlot struct {
	t *time.Timer

	mu  sync.Mutex
	d   *deadlines // the deadlines it serves; nil while it is free
	due time.Time  // when t fires; zero when it is stopped or has fired
}

func newTimerSlot() *timerSlot {
	s := &timerSlot{}
	s.t = time.AfterFunc(time.Hour, s.fire)
	s.t.Stop()
	return s
}

// timerSlots is a handler's free timer slots, at most maxFreeTimers; the
// zero value is empty. It is a list of its own rather than a sync.Pool,
// which drops what it holds at a garbage collection: a dropped slot's
// running timer would keep it alive until it fires, up to a deadline away.
// With the race detector, which drops a quarter of a Pool's Puts, 20,000
// calls kept 1 MiB so (TestFallbackMemoryBoundChunked).
type timerSlots struct {
	mu   sync.Mutex
	free []*timerSlot
}

// maxFreeTimers bounds the free slots a handler keeps: a slot given back
// beyond it is stopped and left to the collector.
const maxFreeTimers = 1024

func (p *timerSlots) lend() *timerSlot {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return s
	}
	p.mu.Unlock()
	return newTimerSlot()
}

func (p *timerSlots) recycle(s *timerSlot) {
	p.mu.Lock()
	if len(p.free) < maxFreeTimers {
		p.free = append(p.free, s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	s.t.Stop()
}

func (s *timerSlot) fire() {
	s.mu.Lock()
	s.due = time.Time{}
	d := s.d
	s.mu.Unlock()
	if d != nil && d.fire() {
		d.owner.expire()
	}
}

// serve makes d the deadlines the slot's firings reach; nil for none.
func (s *timerSlot) serve(d *deadlines) {
	s.mu.Lock()
	s.d = d
	s.mu.Unlock()
}

// arm makes the timer fire for d no later than at.
func (s *timerSlot) arm(d *deadlines, at, now time.Time) {
	s.mu.Lock()
	s.d = d
	if s.due.IsZero() || at.Before(s.due) {
		s.due = at
		s.t.Reset(at.Sub(now))
	}
	s.mu.Unlock()
}

// start makes cancel the current attempt's, an attempt sent at now
// (afterCut: it is the call's last and follows one cut at its limit;
// unanswered: its upstream has never answered), and arms the timer for the
// earlier of the attempt deadline (limit from now; 0 for none) and the
// total deadline.
func (d *deadlines) start(cancel context.CancelCauseFunc, afterCut, unanswered bool, limit time.Duration, now time.Time) {
	at, why := d.totalAt, totalCause
	if limit > 0 {
		if a := now.Add(limit); at.IsZero() || a.Before(at) {
			at, why = a, attemptCause
		}
	}
	d.mu.Lock()
	prev := d.cancel
	d.cancel, d.fired, d.inBody = cancel, noCause, false
	d.sent, d.held = now.Sub(d.owner.h.epoch), false
	d.afterCut, d.unanswered = afterCut, unanswered
	d.armLocked(at, why, now)
	d.mu.Unlock()
	if prev != nil {
		prev(nil) // the previous attempt failed without a body to drain
	}
}

// answered is called when an attempt's RoundTrip returns. It reports the
// deadline that cut the attempt short, if one did; otherwise the attempt
// deadline no longer applies. held says that the attempt outlived its
// limit, queued behind others (fire).
func (d *deadlines) answered() (fired error, held bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fired == noCause {
		d.inBody = true
	}
	return d.fired.err(), d.held
}

// armLocked sets the timer to cancel the current attempt with cause at t; a
// zero t disarms it (a firing still pending then finds nothing to do).
// d.mu must be held.
func (d *deadlines) armLocked(t time.Time, why cause, now time.Time) {
	if t.IsZero() {
		d.armedCause = noCause
		return
	}
	d.armedAt, d.armedCause = t, why
	if d.timer == nil {
		d.timer = d.owner.h.timers.lend()
	}
	d.timer.arm(d, t, now)
}

// releaseTimerLocked gives the timer back to the handler's free slots, still
// running if it is (timerSlot). d.mu must be held.
func (d *deadlines) releaseTimerLocked() {
	if d.timer != nil {
		d.timer.serve(nil)
		d.owner.h.timers.recycle(d.timer)
		d.timer = nil
	}
	d.armedCause = noCause
}

// overtakeMargin sets how much later than an attempt another must have been
// sent, as a fraction of the attempt limit, for its answer to show that the
// first is stuck rather than queued (a later request with a shorter service
// time overtakes an earlier one in any queue); an attempt held past its
// limit (holds) is looked at again each such fraction.
const overtakeMargin = 4

// holdStep is the margin and the interval of the overtaking test for an
// attempt limit: a quarter of it, and never under a millisecond, so that a
// limit of a few nanoseconds (valid, if odd) does not re-arm the timer at
// once, again and again, for as long as the attempt is held.
func holdStep(limit time.Duration) time.Duration {
	return max(limit/overtakeMargin, time.Millisecond)
}

// holdBound is how many attempt limits a held attempt may wait past its
// send when the call has no total deadline, or its upstream had never
// answered: the standard handler's ratio of TotalTimeout to AttemptTimeout
// (30 s to 10 s). A held attempt is a bet that it is queued; without a
// total deadline, or any answer yet, the bet still has an end.
const holdBound = 3

// holds reports whether the current attempt, at its limit at now (since
// the handler's epoch), is held rather than cut: a bet that the upstream
// has it queued. It is cut, as Polly cuts every attempt, where it is
// known to be stuck or cannot be queued:
//   - the upstream has served an attempt of the handler sent a step or
//     more after it (overtaken): it is stuck, not queued (a lost
//     connection, a hung request, an endpoint its siblings answer past);
//   - its upstream has never answered (a black hole, a hung endpoint, a
//     new handler's first hung request): there is no queue it is known to
//     wait in, and the circuit must hear of it at the attempt timeout.
//     Only a call's last attempt that follows a cut is held then, when
//     the cuts did not help: a slow upstream that works gets its chance
//     to answer;
//   - its hold has lasted holdBound limits, without a total deadline or at
//     an upstream that never answered.
//
// Otherwise it is held, up to the total deadline: at an upstream that
// answers, an attempt that nothing has overtaken is queued or the upstream
// stalls, and cut short it would still be served, to nobody. A lone
// attempt is held too (a sequential caller's; a replica's among N, which
// sends as few): which of the two it is, nothing the handler sees can
// tell, and a fleet that cut served 6-61 % of a slowed upstream's
// capacity where bare clients served 99 % (bench/README.md). d.mu must be
// held.
func (d *deadlines) holds(now time.Duration) bool {
	c := d.owner
	limit := c.attemptLimit
	if c.h.overtaken(d.sent + holdStep(limit)) {
		return false
	}
	if (d.totalAt.IsZero() || d.unanswered) && now-d.sent >= holdBound*limit {
		return false
	}
	return d.held || !d.unanswered || d.afterCut
}

// fire cancels the current attempt if its deadline has passed, and reports
// whether the total deadline has passed while the caller holds the body:
// the owner's call then ends (expire).
func (d *deadlines) fire() (expire bool) {
	d.mu.Lock()
	why, cancel := d.armedCause, d.cancel
	now := time.Now()
	if why == noCause || cancel == nil {
		d.mu.Unlock() // disarmed
		return false
	}
	if now.Before(d.armedAt) {
		// A firing for an earlier deadline: d's own is still ahead.
		d.timer.arm(d, d.armedAt, now)
		d.mu.Unlock()
		return false
	}
	if why == attemptCause && d.inBody {
		// The headers came in time; from here on only the total deadline counts.
		d.armLocked(d.totalAt, totalCause, now)
		d.mu.Unlock()
		return false
	}
	if why == attemptCause && !d.owner.strictAttempts() && d.holds(now.Sub(d.owner.h.epoch)) {
		// The attempt is queued, not stuck: cut short it would still be
		// served, to nobody. It waits, and is looked at again a step later.
		if f := d.owner.h.onHold; f != nil && !d.held {
			f()
		}
		d.held = true
		at := now.Add(holdStep(d.owner.attemptLimit))
		if !d.totalAt.IsZero() && !at.Before(d.totalAt) {
			at, why = d.totalAt, totalCause
		}
		d.armLocked(at, why, now)
		d.mu.Unlock()
		return false
	}
	d.fired, d.armedCause = why, noCause
	expire = why == totalCause && d.delivered
	d.mu.Unlock()
	cancel(why.err())
	return expire
}

// attemptBudget is how long an attempt sent at now may take, as the
// deadline contract sends it: until the earlier of the total deadline and
// the request context's, or false when neither applies. Its attempt
// deadline bounds it too only where attempts are strict (strictAttempts):
// otherwise an attempt that nothing overtook waits on past it, queued, and
// a server told the attempt timeout would drop work its caller still
// waits for (in the fleet experiment, an aware upstream behind server.New
// then served 65-88 % of what it could during a slowdown, where the
// handler without the server half served 92-97 %).
func (c *call) attemptBudget(now time.Time) (time.Duration, bool) {
	at := c.deadline()
	if d := c.attemptLimit; d > 0 && c.strictAttempts() {
		if a := now.Add(d); at.IsZero() || a.Before(at) {
			at = a
		}
	}
	if at.IsZero() {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// deadline is when the call must be over: the earlier of the total
// timeout and the request context's own deadline (http.Client.Timeout is
// one), or zero when it has neither.
func (c *call) deadline() time.Time {
	deadline := c.totalAt
	if d, ok := c.req.Context().Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	return deadline
}

// strictAttempts reports whether c's attempts are cut at their limit
// whether or not another overtook them: the handler says so, or the call
// asked for its own attempt timeout (WithAttemptTimeout).
func (c *call) strictAttempts() bool {
	return c.cfg.StrictAttemptTimeout || (c.over != nil && c.over.hasAttempt)
}
