// Package overload is the overload limiter of the resilience handler
// (issue 19). It bounds the attempts in flight to one upstream (per host
// with PerHost). An attempt holds a slot from the moment it is sent until
// its response headers arrive or it fails; reading the body holds none. Two
// limits apply, and an attempt needs room under both:
//
//   - the latency limit (gradient.go), failsafe-go's adaptivelimiter's
//     algorithm at a fraction of its cost: the p90 of recent times to
//     headers against a baseline, with the correlation of throughput and
//     latency with concurrency deciding whether a slower upstream is a
//     fuller one. failsafe-go's, measured alone in the overload experiment
//     (bench/results/overload-3seeds.md) it served 99% of the physical limit
//     when the service slowed 2.5x and 97% when capacity halved, with no
//     time wasted on callers gone; but with its defaults (initial limit 20,
//     no queue) it lost 480 of a healthy burst of 500 calls. Here it starts
//     at Options.InitialLimit (the handler's Options.Overload.InitialLimit),
//     never falls under MinLimit, and calls over the limit wait in this
//     package's FIFO queue rather than fail: the burst drains through the
//     queue.
//   - the loss cap, this package's AIMD: a fast 503 or 429 looks healthy to
//     a latency limit, yet an upstream whose shedding costs it work needs
//     fewer attempts, not more. While losses are congestion (below), an
//     attempt timeout, a 503, a 429 or a refused connection cuts the cap
//     to lossFactor of the attempts in flight (at most once per
//     lossWindow, never under MinLimit); each success
//     adds 1/cap, as TCP's congestion window grows by one per round trip
//     (a quarter of that while losses are congestion: congestedGrowth);
//     once the cap is back over MaxLimit it is lifted. failsafe-go's
//     limiter has no hook for loss, hence this one beside it.
//
// First attempts of new calls wait for a slot in the queue, bounded by
// MaxQueue, MaxQueueWait and the call's deadline less the smoothed time to
// headers, read again when that wait ends (an upstream whose queue drained
// meanwhile answers sooner): a call waits while it could still be answered
// in time; one that could not is refused, not sent to be served to nobody. A fixed 1 s wait
// refused 538-628 calls of the fleet experiment's slowdown that bare served
// in time; this refuses 18 (bench/results/fleet-held.md). Retries wait in the same
// queue while the limiter is not shedding; while it is (it refused a first
// attempt within the last second, or the loss cap is cutting) they only
// try, so that they are shed first. Hedges only ever try: a hedge not sent
// costs its call nothing. A retry that never waits would be shed whenever
// more callers are at work than the limit, healthy upstream or not: 32
// callers against a limit of 20 lost a quarter of the calls that needed a
// retry (the root package's TestOverloadLeavesRandomFailuresToRetries).
//
// An upstream that says nothing is not waited for: while nothing in flight
// has been answered, nor lost, for silenceFactor usual times to headers (a
// stall), a first attempt that would wait is sent, the waiters first, with
// no slot; so are those over the limit after it, while the stall's
// attempts or theirs are in flight, until one of theirs times out
// (silentLocked, Acquire). Held at the limit, the calls of a stall reach
// the upstream's queue later than a bare client's calls of the same time,
// and its backlog is served 20 at a time.
//
// The handler keeps one Limiter per upstream, built from its
// OverloadOptions (Options here, without what the handler alone reads),
// and turns a Refusal into its OverloadError and Stats into its
// OverloadStats.
package overload

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options are what a Limiter is built from: the handler's OverloadOptions,
// resolved and validated (the handler reads MaxQueueWait itself, to give
// Acquire its wait). The zero Options is not valid.
type Options struct {
	MinLimit     int // fewest attempts in flight allowed
	MaxLimit     int // most allowed
	InitialLimit int // where the limit starts, within MinLimit and MaxLimit
	MaxQueue     int // how many attempts may wait
}

// A Limiter is one upstream's overload limiter. New makes one.
type Limiter struct {
	opts Options
	now  func() time.Time // time.Now; a test's clock
	// ownStall reports whether the process's goroutines waited more than
	// d to run lately (stallMeter.stalled; a test's stub), and ownLook
	// has the meter look for a base (stallMeter.look); ownStarved reports
	// whether the operating system starved the process's threads of a CPU
	// lately (stallMeter.starved; a test's stub)
	ownStall   func(now time.Time, d time.Duration) bool
	ownLook    func(now time.Time, d time.Duration)
	ownStarved func(now time.Time) bool

	mu          sync.Mutex
	latency     *gradient // the latency limit
	inflight    int
	peak        int     // most attempts in flight since the last cut
	lossCap     float64 // +Inf while no loss holds it
	lossRate    float64 // moving share of attempts lost: 503, 429, refused, timed out
	lossBase    float64 // the same share, averaged over far more attempts
	low, high   lossBin // the same share of attempts sent with at most MinLimit in flight, and with more
	lastCut     time.Time
	srtt        time.Duration // smoothed time to headers of successful attempts, one in rttEvery of them
	recentRTT   time.Duration // time to headers of the last few latency samples (weight recentWeight)
	queueRTT    time.Duration // the same of attempts sent from the queue since it was last empty; 0: none yet
	usualRTT    time.Duration // the same over far more (weight usualWeight)
	answered    uint64        // successful attempts so far
	seen        uint64        // successful attempts in the second before sampleUntil
	stride      uint64        // one successful attempt in stride is a latency sample (sampleLocked); 0 until the first
	sampleUntil time.Time
	waiters     []*waiter
	queueing    uint32      // the queue's last 32 events, newest lowest: 1 a waiter arrived, 0 one was served
	refusedAt   time.Time   // the last refusal
	firstAt     time.Time   // the last refusal of a first attempt
	state       bool        // overloaded, as last reported
	reported    atomic.Bool // state, read without mu: while it is false only a refusal can change it
	refused     uint64      // refusals so far
	silent      int         // attempts in flight sent while the upstream was silent (silentLocked)
	unslotted   int         // attempts in flight sent with no slot since (unslotted)
	freeEnded   bool        // an attempt sent with no slot since the upstream was last silent timed out
	heardAt     time.Time   // when the upstream last answered, or lost an attempt (of the answers, one in rttEvery at least)
	busyAt      time.Time   // when an attempt was last sent with none in flight
}

// The loss cap's constants. lossWindow is the least time between two cuts
// (the cap cuts once per round trip of its own, as TCP does, and not more
// often than this); quiet is how long without a refusal ends the overloaded
// state.
//
// A loss cuts the cap only while losses are congestion. An upstream that
// fails a share of its requests at random is not made healthier by fewer
// of them in flight: TCP's AIMD under random loss p settles near
// 1.2/sqrt(p) in flight (Mathis et al., 1997), 5 for 5% of 503s, under any
// MinLimit, and every retry over it was shed. So it went before this test:
// 16 callers against an upstream failing one request in 20 lost 32 of 800
// calls that their retries would have served
// (the root package's TestRetryBudgetAllowsOccasionalRetries).
//
// The test is concurrency: a full upstream loses the attempts sent over
// what it holds, one failing at random loses as many at any level. Losses
// are congestion when attempts sent with more than MinLimit in flight are
// lost more often than those sent with fewer: over lossCrowd, and by more
// than binZ standard errors of the difference (a two-proportion z-test)
// and binMargin, once each level has binSamples. Until then, losses are congestion when lossRate, a moving average over the
// last hundred or so attempts (weight lossWeight each), is over lossFloor
// and over lossBase, the same average over several hundred (baseWeight),
// by lossMargin: the floor leaves alone the partial failures retries are
// for (the do-no-harm experiment's mix20 fails 20% of attempts), and the
// base rises to losses that stay whatever the cap does. failsafe-go's
// adaptivethrottler and the SRE throttle tolerate losses too, up to 1-1/K
// (50% at K=2), whatever their cause. Measured (bench/results/donoharm.md,
// overload-noharm.md): 32 callers at 50% random loss are served 93.9%
// (93.5 with the limiter off; 89.9 with the rate test alone, an earlier
// run), an upstream whose 503s cost it work at 1.25x 76.5% of 2,000 calls
// (bare 73.2), its goodput 98.2% of its measured limit. A cap cut by every
// loss lost 4% of calls at 5% random loss.
const (
	lossFactor = 0.9
	lossWindow = 20 * time.Millisecond
	lossWeight = 1.0 / 64
	baseWeight = 1.0 / 512
	lossFloor  = 0.3
	lossMargin = 0.15
	lossCrowd  = 0.1
	binSamples = 16
	binWeighs  = 127
	binZ       = 3
	binMargin  = 0.05
	quietAfter = time.Second

	// congestedGrowth slows the cap's growth while losses are congestion:
	// each step over what the upstream holds costs it a rejected attempt,
	// and probing a quarter as often raised the goodput of the do-no-harm
	// experiment's rejection-cost upstream from 96.3% to 97.9% of its
	// physical limit at 1.25x, and from 96.3% to 97.9% at 2x
	// (bench/results/donoharm.md).
	congestedGrowth = 0.25
)

// A grant is how an attempt was sent.
type grant uint8

const (
	freeSlot  grant = iota // a slot was free: it did not wait
	fromQueue              // it waited in the queue for a slot under the limit
	overLimit              // over the limit, while the client stalled (stalledLocked): it did not wait for a slot
	unslotted              // since the upstream was silent, before the attempts sent then ended: it holds no slot
	inSilence              // while the upstream was silent (silentLocked): it holds no slot
)

type waiter struct {
	ready   chan struct{}
	until   time.Time // its call's deadline; zero: none
	granted bool      // under mu
	doomed  bool      // refused by grantLocked: too little time left to be answered
	how     grant     // under mu until granted, then written before ready is closed
	k       int       // attempts in flight once granted, its own included
}

// A lossBin is the share of attempts lost among those sent at some level
// of concurrency: their mean while there are few, then a moving average.
type lossBin struct {
	rate float64
	n    int
}

func (b *lossBin) add(lost float64) {
	b.n++
	b.rate += (lost - b.rate) * max(1/float64(b.n), lossWeight)
}

// New returns a limiter built from o that reads the time from now
// (time.Now, or a test's clock) where its arithmetic needs it.
func New(o Options, now func() time.Time) *Limiter {
	m := newStallMeter(time.Now())
	return &Limiter{opts: o, now: now, ownStall: m.stalled, ownLook: m.look, ownStarved: m.starved, lossCap: math.Inf(1),
		latency: newGradient(o.MinLimit, o.MaxLimit, o.InitialLimit, now())}
}

// limitLocked is the number of attempts allowed in flight now.
func (l *Limiter) limitLocked() int {
	lim := int(l.latency.limit)
	if l.lossCap < float64(lim) {
		lim = int(l.lossCap)
	}
	return max(lim, l.opts.MinLimit)
}

// A Slot is an attempt's hold on the limiter; the zero value holds
// nothing.
type Slot struct {
	l   *Limiter
	at  time.Time
	k   int // attempts in flight when it was sent, its own included
	how grant
}

// queued reports whether s's attempt waited in the queue for its slot.
func (s *Slot) queued() bool { return s.how == fromQueue }

// Held reports whether s holds a slot of a limiter: it is not the zero
// Slot.
func (s *Slot) Held() bool { return s.l != nil }

// At is when s's attempt got its slot: the now given to Acquire, or the
// end of its wait.
func (s *Slot) At() time.Time { return s.at }

// A Kind is what an attempt is to its call, as Acquire treats it.
type Kind uint8

const (
	First Kind = iota // the call's first attempt
	Retry             // an attempt after a failure: a retry, or a hedge sent on a handled failure
	Hedge             // a hedge sent while an earlier attempt of its call still runs
)

// Acquire takes a slot for an attempt of kind k. An attempt given a wait
// > 0 waits in the queue up to wait (and, when until is not zero, until
// then), or until ctx ends; a retry waits only while the limiter is not
// shedding, and is refused at once while the upstream is sluggish
// (sluggishLocked). Otherwise, or with the queue full, it is refused at
// once. A refusal returns a non-nil error: ctx's, or a *Refusal. until is
// read only when the attempt must wait, and a free slot is taken at now,
// so that it costs no clock read.
//
// A hedge is not shed for a sluggish upstream: it is sent because its
// call's attempt is slow to be answered, and shed for that it would never
// be sent where it helps (after two slow calls, 5 hedges of 5). What
// bounds hedges is the caller's (Hedging.MaxExtraLoad, the retry budget
// for a hedge on a failure) and the limit: given no wait, a hedge only
// tries for a slot.
func (l *Limiter) Acquire(ctx context.Context, wait time.Duration, until time.Time, k Kind, now time.Time) (Slot, error) {
	l.mu.Lock()
	if k == Retry && l.sluggishLocked() && !l.stalledLocked(now) && !l.ownStarved(now) {
		err := l.refuseLocked(0, k)
		err.Latency, err.Usual = l.recentRTT, l.usualRTT
		l.mu.Unlock()
		return Slot{}, err
	}
	if len(l.waiters) == 0 && l.inflight < l.limitLocked() {
		if l.inflight == 0 {
			l.busyAt = now
		}
		k := l.takeLocked()
		l.mu.Unlock()
		return l.slot(k, now), nil
	}
	start := time.Now()
	if wait > 0 && k == First {
		silent := l.silentLocked(start)
		if silent {
			l.freeEnded = false
		}
		if silent || ((l.silent > 0 || l.unslotted > 0) && !l.freeEnded) {
			// The upstream stalls: nothing in flight has been answered
			// for many usual times to headers. Held here, the calls that
			// arrive meanwhile would queue behind the attempts in flight,
			// and reach the upstream's queue later than a bare client's
			// calls of the same time: after a 2 s stall, ten replicas
			// lost 2-3 % more calls than bare clients, every one of them
			// queued here in the stall's first half second. Sent, the
			// waiters first, they take their places in the upstream's
			// queue, and hold no slot. Nor do the calls sent after the
			// stall, while its attempts or theirs are in flight: held at
			// the limit, they would wait here for the stall's backlog to
			// be served, 20 at a time (one replica refused 130-270 calls
			// in the 12 s after the stall that bare served), where a bare
			// client's join the upstream's queue at once and are served
			// as it drains. Until one of them times out: then the queue
			// does not drain, and the limit is what protects it.
			how := unslotted
			if silent {
				how = inSilence
			}
			var t time.Time
			for len(l.waiters) > 0 {
				l.grantNextLocked(&t, how)
			}
			s := l.slot(l.inflight+1, now)
			s.how = how
			l.countFreeLocked(how, 1)
			l.mu.Unlock()
			return s, nil
		}
	}
	if wait > 0 && l.stalledLocked(start) {
		// Over the limit: the client stalls (stalledLocked). But not ahead
		// of the calls already waiting: the next of them goes in its place,
		// and it waits its turn. Sent ahead of them, new calls took the
		// slots the oldest waited for (a 2 s stall over HTTP/1.1 with room
		// to spare, whose end woke enough goroutines to read as the
		// client's stall: 37 calls lost where bare lost 7, every one
		// waiting since the stall's first 300 ms).
		var t time.Time
		sent := false
		for len(l.waiters) > 0 && !sent {
			sent = l.grantNextLocked(&t, overLimit)
		}
		if !sent { // nobody waiting, or nobody who could still be answered
			k := l.takeLocked()
			l.mu.Unlock()
			return l.slot(k, now), nil
		}
	}
	most := start.Add(wait) // MaxQueueWait's bound
	if wait > 0 && !until.IsZero() {
		wait = min(wait, until.Sub(start)-l.srtt)
	}
	if wait <= 0 || len(l.waiters) >= l.opts.MaxQueue || (k != First && l.sheddingLocked()) {
		err := l.refuseLocked(0, k)
		l.mu.Unlock()
		return Slot{}, err
	}
	w := &waiter{ready: make(chan struct{}), until: until}
	l.waiters = append(l.waiters, w)
	l.queueing = l.queueing<<1 | 1
	l.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	var cause error
	for waiting := true; waiting; {
		select {
		case <-w.ready:
			if w.doomed { // written before ready was closed
				l.mu.Lock()
				err := l.refuseLocked(time.Since(start), k)
				l.mu.Unlock()
				return Slot{}, err
			}
			s := l.slot(w.k, time.Now()) // k and how were written before ready was closed
			s.how = w.how
			return s, nil
		case <-timer.C:
			// The time to headers it was to be refused by may have fallen
			// while it waited (the upstream's queue drained): it waits on
			// while it could still be answered in time.
			now := time.Now()
			l.mu.Lock()
			end := until.Add(-l.srtt)
			if most.Before(end) {
				end = most
			}
			if !w.granted && !until.IsZero() && end.After(now) {
				l.mu.Unlock()
				timer.Reset(end.Sub(now))
				continue
			}
			l.mu.Unlock()
			waiting = false
		case <-ctx.Done():
			cause = ctx.Err()
			waiting = false
		}
	}
	l.mu.Lock()
	if w.granted { // granted as the wait ended: give the slot back if the caller left
		l.mu.Unlock()
		s := l.slot(w.k, time.Now())
		s.how = w.how
		if cause == nil {
			return s, nil
		}
		s.Release(Dropped)
		return Slot{}, cause
	}
	if i := slices.Index(l.waiters, w); i >= 0 {
		l.dequeueLocked(i)
	}
	if cause != nil {
		l.mu.Unlock()
		return Slot{}, cause
	}
	if end := time.Now(); l.stalledLocked(end) {
		k := l.takeLocked() // over the limit: the client stalls (stalledLocked)
		l.mu.Unlock()
		return l.slot(k, end), nil
	}
	err := l.refuseLocked(time.Since(start), k)
	l.mu.Unlock()
	return Slot{}, err
}

// stalledLocked reports whether the process itself stalled lately: 1 in
// 100 of its goroutines waited to run longer than the usual time to
// headers, or half sluggishMargin (stallMeter). What the limiter reads
// then measures the client, not the upstream: a retry is not shed for
// sluggish answers, a timeout is neither a loss nor a latency sample
// (Slot.End), and an attempt that would wait for a slot, or be refused
// at the end of its wait, is sent over the limit, whose slots are held by
// attempts whose answers have come and wait for the client's goroutines
// to read them. In the no-harm probe with the client's CPU starved
// (GOMAXPROCS 1, busy goroutines, a healthy upstream), 200-300 calls
// queued behind a limit of 25-27, and retries were refused at the end of
// their wait in 6 of 12 runs (1-2 a run), where a client with the limiter
// off served every call.
func (l *Limiter) stalledLocked(now time.Time) bool {
	return l.ownStall(now, l.stallLineLocked())
}

// stallLineLocked is how long the process's goroutines must wait to run
// for the stall meter to call it a stall: the usual time to headers, or
// half sluggishMargin.
func (l *Limiter) stallLineLocked() time.Duration {
	return max(l.usualRTT, sluggishMargin/2)
}

// silentLocked reports whether the upstream has said nothing, neither an
// answer nor a loss, while attempts were in flight, for silenceFactor
// usual times to headers (silenceFloor at least): a stall, not a slower
// upstream, whose answers keep coming.
func (l *Limiter) silentLocked(now time.Time) bool {
	if l.inflight == 0 || l.heardAt.IsZero() {
		return false
	}
	since := l.heardAt
	if l.busyAt.After(since) {
		since = l.busyAt
	}
	return now.Sub(since) > max(silenceFactor*l.usualRTT, silenceFloor)
}

// countFreeLocked adds d to the count of attempts in flight sent how,
// inSilence or unslotted.
func (l *Limiter) countFreeLocked(how grant, d int) {
	if how == inSilence {
		l.silent += d
	} else {
		l.unslotted += d
	}
}

// silenceFactor and silenceFloor: how long an upstream must say nothing
// for silentLocked.
const (
	silenceFactor = 8
	silenceFloor  = 50 * time.Millisecond
)

// takeLocked counts an attempt in flight and returns how many are, its own
// included.
func (l *Limiter) takeLocked() int {
	l.inflight++
	l.peak = max(l.peak, l.inflight)
	return l.inflight
}

// slot is the slot of an attempt sent with k in flight, its own included,
// at at: now for one that did not wait.
func (l *Limiter) slot(k int, at time.Time) Slot {
	return Slot{l: l, at: at, k: k}
}

func (l *Limiter) refuseLocked(waited time.Duration, k Kind) *Refusal {
	l.refused++
	l.refusedAt = l.now()
	if k == First {
		l.firstAt = l.refusedAt
	}
	return &Refusal{Limit: l.limitLocked(), InFlight: l.inflight, Latency: l.srtt, Waited: waited}
}

// A Refusal is why the limiter refused an attempt, at its limit with the
// queue full or the wait too long, or a retry while the upstream is
// sluggish: the limiter as it stood then. Its fields are those of the
// handler's OverloadError, which it becomes.
type Refusal struct {
	Limit    int           // attempts allowed in flight when it refused
	InFlight int           // attempts in flight then
	Latency  time.Duration // smoothed time to headers of successes; with Usual, of the last few
	Waited   time.Duration // how long the call waited for a slot
	Usual    time.Duration // usual time to headers, when Latency is far over it and a retry was shed
}

func (e *Refusal) Error() string {
	if e.Usual > 0 {
		return fmt.Sprintf("resilience: upstream overloaded: retry shed, its last answers took %v against a usual %v",
			e.Latency.Round(time.Microsecond), e.Usual.Round(time.Microsecond))
	}
	return fmt.Sprintf("resilience: upstream overloaded: %d attempts in flight, limit %d, latency %v, waited %v",
		e.InFlight, e.Limit, e.Latency.Round(time.Microsecond), e.Waited.Round(time.Microsecond))
}

// An Outcome is what an attempt's end tells the limiter.
type Outcome int

// Outcomes of an attempt, as the handler reads them from its response or
// error.
const (
	Answered Outcome = iota // response headers: a latency sample
	Loss                    // 503, 429, refused connection: the cap shrinks; no latency sample
	Timeout                 // the attempt timed out: the cap shrinks, and its duration is the sample (unless the client itself stalled, or it was sent from the queue: Dropped)
	Dropped                 // the caller or the call gave up, or the request failed: says nothing
)

// rttEvery is how many successful attempts give the smoothed latency one
// sample: it reads the clock, which costs 60 to 70 ns here, and a moving
// average of every fourth attempt over 8 samples follows the upstream
// within 32 attempts.
const rttEvery = 4

// Release ends s's hold with the attempt's outcome.
func (s *Slot) Release(o Outcome) {
	s.End(o, -1)
}

// End is Release, with rtt the attempt's time to headers; -1 has End
// measure it, for one in rttEvery successful attempts.
func (s *Slot) End(o Outcome, rtt time.Duration) {
	l := s.l
	if l == nil {
		return
	}
	l.mu.Lock()
	if o == Timeout && l.stalledLocked(time.Now()) {
		// Timed out while the client's own goroutines waited to run: as
		// far as anyone can tell, the client's stall, not the upstream's
		// loss or latency. Counted as losses, such timeouts in the no-harm
		// probe with the client's CPU starved had retries shed as if the
		// upstream were full (10 in 1 run of 4, 2 in 1 of 2: calls a client
		// with the limiter off served).
		o = Dropped
	}
	if o == Timeout && s.queued() {
		// Sent from the queue, with part of its deadline spent there: its
		// timeout is the client's wait as much as the upstream's. Counted
		// as a loss, it cut the cap of the replica whose queue was the
		// longest, whose next calls then waited longer and timed out in
		// turn: after a 2 s stall, one of ten replicas fell to a limit of
		// 8 while the others kept 20, and refused calls for 3 s after the
		// others had recovered. Attempts sent from the queue too late to be
		// answered are refused instead (grantLocked); the latency limit
		// reads the queue's slowness from the answers.
		o = Dropped
	}
	if o == Loss {
		l.heardAt = time.Now()
	}
	sample, smoothed := o == Timeout, rtt >= 0
	if o == Answered {
		smoothed = smoothed || l.answered%rttEvery == 0
		l.answered++
		sample = l.sampleLocked(s.at)
	}
	if sample || (rtt < 0 && smoothed) {
		now := time.Now()
		if rtt < 0 {
			rtt = now.Sub(s.at)
		}
		if o == Answered {
			l.heardAt = now
		}
		if sample {
			// The limit is full while this attempt still holds its slot.
			l.latency.sample(now, rtt, s.k, l.inflight >= int(l.latency.limit))
			if o == Answered {
				l.paceLocked(rtt)
				switch {
				case !s.queued() || len(l.waiters) == 0: // none, or not since the queue was last empty
				case l.queueRTT == 0:
					l.queueRTT = rtt
				default:
					l.queueRTT += (rtt - l.queueRTT) / recentWeight
				}
			}
		}
	}
	if !smoothed {
		rtt = 0 // not the smoothed latency's sample
	}
	l.signalLocked(o, max(rtt, 0), s.k)
	switch s.how {
	case inSilence, unslotted:
		l.countFreeLocked(s.how, -1)
		if s.how == unslotted && o == Timeout {
			l.freeEnded = true
		}
	default:
		l.inflight--
	}
	l.grantLocked()
	l.mu.Unlock()
}

// latencySamples and latencyFloor bound the successful attempts a second
// whose latency the latency limit is given: each costs a clock read, and a
// window keeps at most gradientKeep. Below 512 a second (the overload
// experiment's upstream answers 400), every success is a sample. Above,
// the first latencyFloor of each second are, and then one in stride, set
// each second from the rate of the second before: about latencySamples a
// second more, and never fewer than the 50 a window needs, even in the
// second after a fast one. Timeouts are always samples.
const (
	latencySamples = 256
	latencyFloor   = 64
)

// sampleLocked reports whether a successful attempt sent at at gives the
// latency limiter its sample (latencySamples). Once a second, it has the
// stall meter look at the goroutines' waits: a look more than stallMemory
// after the last one only takes a base (stallMeter.scheduledLocked), and
// without these the first look of a stall, the one that decides whether
// a retry is shed, could see nothing (bench/starved_test.go, the client at
// GOMAXPROCS 1 beside busy goroutines: 4 calls of 200,000 shed without
// them, none with them). The look costs about 200 ns, once a second.
func (l *Limiter) sampleLocked(at time.Time) bool {
	if !at.Before(l.sampleUntil) {
		l.stride = max(1, l.seen/latencySamples)
		l.seen, l.sampleUntil = 0, at.Add(time.Second)
		l.ownLook(at, l.stallLineLocked())
	}
	l.seen++
	return l.seen <= latencyFloor || l.seen%l.stride == 0
}

// signalLocked applies the outcome of an attempt sent with k in flight to
// the loss cap and, for a success with its time to headers rtt (0: not
// sampled), the smoothed latency.
func (l *Limiter) signalLocked(o Outcome, rtt time.Duration, k int) {
	if o != Dropped {
		bin := &l.high
		if k <= l.opts.MinLimit {
			bin = &l.low
		}
		lost := 0.0
		if o != Answered {
			lost = 1
		}
		bin.add(lost)
	}
	switch o {
	case Answered:
		l.lossRate -= l.lossRate * lossWeight
		l.lossBase -= l.lossBase * baseWeight
		switch {
		case rtt == 0:
		case l.srtt == 0:
			l.srtt = rtt
		default:
			l.srtt += (rtt - l.srtt) / 8
		}
		if !math.IsInf(l.lossCap, 1) {
			inc := 1 / l.lossCap
			if l.congestedLocked() {
				inc *= congestedGrowth
			}
			l.lossCap += inc
			if l.lossCap > float64(l.opts.MaxLimit) {
				l.lossCap = math.Inf(1)
			}
		}
	case Loss, Timeout:
		l.lossRate += (1 - l.lossRate) * lossWeight
		l.lossBase += (1 - l.lossBase) * baseWeight
		if !l.congestedLocked() {
			return // the upstream fails some requests; that is not a full one
		}
		// The slot this attempt frees is not handed on: a fast 503 would
		// otherwise free it for the next attempt into the same full upstream.
		l.lossCap = max(min(l.lossCap, float64(l.inflight-1)), float64(l.opts.MinLimit))
		now := l.now()
		if now.Sub(l.lastCut) < max(lossWindow, l.srtt) {
			return
		}
		l.lastCut = now
		c := min(l.lossCap, float64(l.peak)) * lossFactor
		l.lossCap = max(c, float64(l.opts.MinLimit))
		l.peak = l.inflight - 1 // those that stay in flight
	}
}

// The constants of sluggishLocked: the weights of the two averages of the
// time to headers, and how much slower than usual the recent one must be:
// sluggishFactor times, and by sluggishMargin at least. An upstream that
// queues what it is given answers many times slower at once (the fleet
// experiment's 7 to 10 times). With a margin of 5 ms, 16 callers of a
// loopback server that fails a fifth of its requests at random, in a
// test process busy with others, had answers of 8 ms against a usual 2.3,
// and lost 2 of 800 calls their retries would have served
// (TestOverloadLeavesRandomFailuresToRetries). Five times over the last
// two answers, rather than three over the last four, cost the fleet's
// capacity drop 10 points at N = 10 (bench/README.md).
const (
	recentWeight   = 4   // about the last four latency samples
	usualWeight    = 128 // about the last few hundred
	sluggishFactor = 3
	sluggishMargin = 10 * time.Millisecond
)

// paceLocked takes a latency sample of a success into the recent and the
// usual time to headers.
func (l *Limiter) paceLocked(rtt time.Duration) {
	if l.usualRTT == 0 {
		l.recentRTT, l.usualRTT = rtt, rtt
		return
	}
	l.recentRTT += (rtt - l.recentRTT) / recentWeight
	l.usualRTT += (rtt - l.usualRTT) / usualWeight
}

// sluggishLocked reports whether the upstream's last successes came far
// slower than usual: it is queuing the work it is given, and a retry, of
// a refusal or of anything else, would take its time from calls that have
// not had one attempt yet. The limit cannot say so for a fleet: each of
// 200 Handlers sending 1.6 calls a second is far under it, and each one's
// retries, which its own few refusals do not count as congestion, added
// up to 1.5 attempts a call against a shedding upstream, that served 67 %
// of what it could where bare clients had 92 % (bench/results/
// fleet-shedding-*.md). Latency needs no count: a few samples show it.
// A retry shed is only what a bare client would have had: the answer its
// call already got. Answers made late by the client's own stalls are not
// the upstream's: while its goroutines wait longer than the usual time to
// headers to run, or half sluggishMargin (stalledLocked), or the
// operating system starves its threads of a CPU (stallMeter.starved), no
// retry is shed for it (Acquire). At the whole margin, the starved client
// of BenchmarkFleetNoHarm had a retry shed; with the goroutines' waits
// alone, a client beside processes spinning on its cores, whose
// goroutines are running while their threads wait, had 1 to 3 calls in
// 10,000 shed (bench/starved_test.go, issue 47).
//
// The threads' waits are read for this rule alone: an attempt over the
// limit is not sent over it, nor a timeout taken for the client's own,
// for them. A client whose CPU is shared, or throttled, with its limiter
// off whenever its threads wait for one, would not be protected where it
// is most likely to be too many.
func (l *Limiter) sluggishLocked() bool {
	return l.usualRTT > 0 && l.recentRTT > max(sluggishFactor*l.usualRTT, l.usualRTT+sluggishMargin)
}

// congestedLocked reports whether recent losses say the upstream is full:
// attempts sent with more than MinLimit in flight are lost more often than
// those sent with fewer; or, where too few were sent at either level to
// tell, losses are high and risen over their base.
func (l *Limiter) congestedLocked() bool {
	if lo, hi := l.low, l.high; lo.n >= binSamples && hi.n >= binSamples {
		// a two-proportion z-test, each moving average counting as the
		// samples it weighs (at most (2-w)/w, 127)
		nl, nh := float64(min(lo.n, binWeighs)), float64(min(hi.n, binWeighs))
		p := (lo.rate*nl + hi.rate*nh) / (nl + nh)
		se := math.Sqrt(p * (1 - p) * (1/nl + 1/nh))
		return hi.rate > lossCrowd && hi.rate-lo.rate > max(binZ*se, binMargin)
	}
	return l.lossRate > lossFloor && l.lossRate > l.lossBase+lossMargin
}

// sheddingLocked reports whether retries only try for a slot: the limiter
// refused a first attempt within quietAfter, or losses say the upstream is
// full.
func (l *Limiter) sheddingLocked() bool {
	return (!l.firstAt.IsZero() && l.now().Sub(l.firstAt) < quietAfter) || l.congestedLocked()
}

// grantLocked hands free slots to the waiters, first come first served,
// but for two cases:
//
//   - a waiter whose call has less time left than the recent time to
//     headers of attempts sent from the queue is refused, not sent: the
//     slot goes to the next;
//   - while the queue grows (growing of its last 32 events were arrivals,
//     not services) and its oldest waiter's call has less than lateFactor
//     times that time left, the newest waiter is served first.
//
// A queue that grows past its oldest waiters sends, first come first
// served, every call at the end of its wait, with about one time to
// headers left: in a sustained overload (the fleet experiment's upstream
// 2.5 times slower for 12 s, one client) half of them timed out, the
// upstream spent 35 % of its time on callers already gone, and from the
// trigger's sixth second to its tenth not one call succeeded (53 % of
// what the upstream could serve). Newest first, a call is sent with most
// of its deadline left, and the oldest run out of time in the queue,
// where they cost the upstream nothing (bench/README.md, "An overload
// that outlasts the deadline").
//
// A queue that drains serves its oldest first even when they have little
// time left, and so does one whose own attempts have not been answered
// yet: after the upstream stalls 2 s, the answers that come first are
// those sent before the stall, 2 s late, while the upstream drains its
// queue at its full rate and the calls waiting can still be answered in
// time. Passing over the oldest by every answer's time to headers, one
// client served 107 % of the upstream's rate in the 4 s after the stall
// where a bare client served 115 % (the oldest ran out of time behind the
// calls that kept arriving); doing so only while the queue grew, but still
// by every answer's time, ten replicas served 97 % where bare clients
// served 116 %.
//
// But a waiter with less time left than attempts from the queue now take
// would be answered too late however the queue is served. Its own wait
// ends at its deadline less the smoothed time to headers, which after a
// stall trails the queue's by hundreds of milliseconds: ten replicas sent
// such calls with 150-500 ms left into an upstream that answered in 500,
// and the replica that sent most lost 47 of the 97 calls started in the
// stall where a bare client lost 6 (bench/README.md, "The stall at
// N = 10").
func (l *Limiter) grantLocked() {
	var now time.Time
	for len(l.waiters) > 0 && l.inflight < l.limitLocked() {
		l.grantNextLocked(&now, fromQueue)
	}
}

// grantNextLocked grants a slot to the waiter grantLocked's rules choose,
// whatever the limit, and reports true; or it refuses the head waiter,
// too late to be answered, and reports false. now is read once, if needed.
// how is how it is sent: fromQueue, or (over the limit, or with no slot,
// see grant) in a newcomer's place. A waiter sent any way but fromQueue
// did not wait for a slot: its time to headers is not the queue's.
// Counted as the queue's, the answers of waiters sent during an
// upstream's 2 s stall set the queue's time to headers to 1.7 s after it,
// and calls with 1.6 s left were refused while the upstream answered in
// 20 ms.
func (l *Limiter) grantNextLocked(now *time.Time, how grant) bool {
	if w := l.waiters[0]; l.queueRTT > 0 && !w.until.IsZero() {
		if now.IsZero() {
			*now = time.Now()
		}
		if w.until.Sub(*now) < l.queueRTT {
			l.dequeueLocked(0)
			w.doomed = true
			close(w.ready)
			return false
		}
	}
	i := 0
	if len(l.waiters) > 1 && !l.waiters[0].until.IsZero() && bits.OnesCount32(l.queueing) >= growing {
		if now.IsZero() {
			*now = time.Now()
		}
		if l.waiters[0].until.Sub(*now) < lateFactor*l.queueRTT {
			i = len(l.waiters) - 1
		}
	}
	w := l.waiters[i]
	l.dequeueLocked(i)
	w.granted, w.how = true, how
	switch how {
	case inSilence, unslotted:
		w.k = l.inflight + 1
		l.countFreeLocked(how, 1)
	default:
		w.k = l.takeLocked()
	}
	l.queueing <<= 1
	close(w.ready)
	return true
}

// dequeueLocked takes waiter i out of the queue. Once the queue is empty,
// what its attempts took is forgotten.
func (l *Limiter) dequeueLocked(i int) {
	if i == 0 {
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
	} else {
		last := len(l.waiters) - 1
		copy(l.waiters[i:], l.waiters[i+1:])
		l.waiters[last] = nil
		l.waiters = l.waiters[:last]
	}
	if len(l.waiters) == 0 {
		l.queueRTT = 0
	}
}

// lateFactor is how many recent times to headers of attempts sent from the
// queue the oldest waiter's call must have left to be served first while
// the queue grows: sent with less, an answer as slow as the last few would
// come too late for it, or just in time.
const lateFactor = 2

// growing is how many of the queue's last 32 events must be arrivals for
// it to grow: 20, 62.5 %, where arrivals twice as fast as the service make
// 67 % and a queue that drains at 1.25 times its arrivals 44 %.
const growing = 20

// Overloaded reports whether the limiter is refusing calls now: it refused
// one within the last second, and reports whether that is a change from
// what it reported last.
func (l *Limiter) Overloaded() (now, changed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now = !l.refusedAt.IsZero() && l.now().Sub(l.refusedAt) < quietAfter
	changed = now != l.state
	l.state = now
	l.reported.Store(now)
	return now, changed
}

// Reported is what Overloaded last reported, read without the limiter's
// lock: while it is false, only a refusal can change it.
func (l *Limiter) Reported() bool { return l.reported.Load() }

// Stats is a snapshot of a limiter. Its fields are those of the handler's
// OverloadStats, which it becomes.
type Stats struct {
	Limit      int           // attempts allowed in flight
	InFlight   int           // attempts in flight holding a slot
	Queued     int           // first attempts waiting
	Latency    time.Duration // smoothed time to headers
	Refused    uint64        // refusals and sheds so far
	Overloaded bool          // it refused one within 1s
}

// Stats is the limiter's state now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Limit: l.limitLocked(), InFlight: l.inflight, Queued: len(l.waiters), Latency: l.srtt, Refused: l.refused,
		Overloaded: !l.refusedAt.IsZero() && l.now().Sub(l.refusedAt) < quietAfter}
}
