package resilience

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/internal/httpcache"
)

// Pacing by the server's own signal. A host (the handler, or each
// authority with PerHost) keeps what its responses said of its quota
// (internal/headers reads them): how many calls are left until the window
// resets, and a pause after a 429 with Retry-After (one that announces the
// quota too, or any with RateLimitOptions.PauseOn429). Admission takes one of
// the calls left, and a call over the quota waits for the reset or fails at
// once, through pace (admission.go), like a call over any other rate.
//
// The count is kept here, not only read: a response says how many calls
// were left when the server answered it, and by then this client may have
// sent more. So a call admitted counts the quota down; a response lowers
// the count to what it says when that is lower (another client spending
// the same quota), and does not raise it within a window, since calls on
// their way are not in its figure. A window this client has not counted in
// (the first one seen, or one the server started sooner than expected)
// starts from the response's figure less the attempts whose answers have
// not come yet; an answer among those that says more was left than that
// figure was counted before it (the server's figure only falls within a
// window), and its call is given back. When the window ends the next one
// starts with the announced quota (or the most ever seen left, plus one)
// and lasts as long (the announced window, or the longest reset seen),
// until a response says otherwise; answers to attempts sent before it
// started, or whose reset falls more than half a window before it, say
// nothing of it. With one client, the count is exact but for the calls on
// their way when a window is first seen; with several sharing the quota,
// this client may overrun it by the calls it has on their way when the
// others spend the last of it.
//
// An answer that names the resource its quota is scoped to
// (X-RateLimit-Resource, the draft's partition key) says nothing of the
// other calls: it is not counted here, but in q.scoped, which holds back
// only the calls known to count against it (quotascope.go).
//
// Retries and hedges of a call spend from the quota but do not wait for it:
// a retry after a 429 waits for its Retry-After, as before.
//
// An answer a cache served (servedFromCache: X-From-Cache, or an Age of a
// second or more) says what the quota was when it was stored, not now: it
// is not read at all, neither its quota nor a 429's Retry-After. Every
// answer read was generated for its request, so a reset given as a time is
// measured from its Date, the server's clock when it answered, and one
// given in seconds from its arrival.
//
// Until a response carries a quota or a 429 with Retry-After, a call pays
// two atomic additions, three atomic loads (one of them q.scoped's) and,
// per response, three header lookups.

// maxServerWait is the longest pause or reset the handler keeps, when
// Retry.MaxRetryAfter does not set another: a server that announces a
// reset an hour away is asked again after a minute.
const maxServerWait = time.Minute

// serverQuota is a host's record of the quota its upstream announces.
type serverQuota struct {
	active  atomic.Bool               // a response announced a quota or a pause: until then nothing is paced
	pause   atomic.Pointer[time.Time] // no call is admitted before, after a 429 with Retry-After
	sending atomic.Int64              // attempts sent whose response headers have not come
	scoped  scopedQuotas              // the refusals of quotas scoped to a resource (quotascope.go)

	mu         sync.Mutex
	resetAt    time.Time     // when the current window ends; zero: no window known, calls go
	remaining  int64         // calls left in it, counted down as they are admitted
	started    time.Time     // when this client began counting in it
	predicted  bool          // resetAt is the last window's end plus its length, not a response's word
	limit      int64         // a window's quota: announced, or the most seen left plus one
	limitSaid  bool          // limit was announced
	window     time.Duration // a window's length: announced, or the longest reset seen
	windowSaid bool          // window was announced
	anchorLeft int64         // what the answer that showed the window said was left
	anchorAt   time.Time     // when it came
	said       *serverAnswer // the answer that showed the window, or said none was left
	pauseSaid  *serverAnswer // the 429 that asked for the pause
}

// take admits a call at now, counting it, or returns how long until the
// quota may admit it.
func (q *serverQuota) take(now time.Time) time.Duration {
	if p := q.pause.Load(); p != nil {
		if d := p.Sub(now); d > 0 {
			return d
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollLocked(now)
	if q.resetAt.IsZero() || q.remaining > 0 {
		q.remaining--
		return 0
	}
	return q.resetAt.Sub(now)
}

// spend counts an attempt sent without asking: a retry or a hedge.
func (q *serverQuota) spend(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollLocked(now)
	q.remaining--
}

// rollLocked starts the next window when the current one has ended. q.mu
// must be held.
func (q *serverQuota) rollLocked(now time.Time) {
	if q.resetAt.IsZero() || now.Before(q.resetAt) {
		return
	}
	next := q.resetAt.Add(q.window)
	if q.window <= 0 || q.limit <= 0 || !now.Before(next) {
		// Nothing to predict the next window by, or windows went by
		// unseen: calls go until a response says more.
		q.resetAt = time.Time{}
		return
	}
	q.started, q.resetAt, q.remaining, q.predicted = q.resetAt, next, q.limit, true
	q.anchorAt = time.Time{}
}

// pauseFor admits no call for d from now, or longer if already paused.
func (q *serverQuota) pauseFor(now time.Time, d time.Duration) {
	until := now.Add(d)
	for {
		p := q.pause.Load()
		if p != nil && !p.Before(until) {
			break
		}
		if q.pause.CompareAndSwap(p, &until) {
			break
		}
	}
	q.active.Store(true)
}

// observe reads what resp, the answer at now to an attempt of req sent at
// sentAt (zero if the quota was not followed yet), says of the quota; h is
// its header with canonical names. A quota scoped to a resource is
// q.scoped's. A 429's
// Retry-After pauses every call when the response announces a quota too
// (the draft gives Retry-After precedence over its reset), or when any 429
// does (RateLimitOptions.PauseOn429). No pause or reset is kept longer than
// most.
func (q *serverQuota) observe(req *http.Request, resp *http.Response, h http.Header, sentAt, now time.Time, most time.Duration, anyTooMany bool) {
	if servedFromCache(h) {
		q.sending.Add(-1)
		return
	}
	r, announced := headers.ReadQuota(h, now)
	if announced && r.Resource != "" {
		q.sending.Add(-1)
		q.scoped.observe(req, resp, h, r, now, most)
		return
	}
	var pause time.Duration
	if resp.StatusCode == http.StatusTooManyRequests && (announced || anyTooMany) {
		if d, ok := headers.RetryAfter(resp, now); ok && d > 0 {
			pause = min(d, most)
			name := "Retry-After"
			if announced {
				name = quotaName(r)
			}
			q.keep(&q.pauseSaid, keepAnswer(resp, h, name, ""))
			q.pauseFor(now, pause)
		}
	}
	if !announced {
		q.sending.Add(-1)
		return
	}
	if q.update(r, sentAt, now, most) {
		q.keep(&q.said, keepAnswer(resp, h, quotaName(r), ""))
	}
	if pause > 0 {
		q.yield(now.Add(pause))
	}
}

// servedFromCache reports whether h, a response's header, says that a
// cache served the response: an X-From-Cache field (as gregjones/httpcache
// and its forks mark what they serve from their store), or an Age of a
// second or more (RFC 9111 section 5.1: the origin neither generated nor
// validated it for this request). Its quota fields, and its Retry-After,
// were the server's word Age seconds ago, or when the cache stored it, and
// may no longer hold: the RateLimit draft (section 7.3) asks that they be
// ignored, and so they are, whatever they say. An Age of 0 is a cache
// passing on what the origin has just generated: it is read.
func servedFromCache(h http.Header) bool {
	return headers.Has(h, "X-From-Cache") || httpcache.ReceivedAge(h) > 0
}

// yield ends the current window at until, the end of a 429's Retry-After,
// when it would otherwise end later with nothing left: the draft gives
// Retry-After precedence over the reset the same answer announces. The
// window that starts then is a prediction, which the next answer corrects.
func (q *serverQuota) yield(until time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.remaining <= 0 && q.resetAt.After(until) {
		q.resetAt, q.predicted = until, true
	}
}

// update applies r, the quota announced in the answer at now to an attempt
// sent at sentAt, and counts that attempt's end: under q.mu, so that an
// answer never finds an attempt gone from sending whose own answer it has
// not yet seen. It reports whether the answer is one a refusal would rest
// on: the first of its window, or one that said none was left in it.
func (q *serverQuota) update(r headers.Quota, sentAt, now time.Time, most time.Duration) (kept bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sending.Add(-1)
	q.active.Store(true)
	r.Reset, r.Window = min(r.Reset, most), min(r.Window, most)
	switch {
	case r.Limit > 0:
		q.limit, q.limitSaid = r.Limit, true
	case !q.limitSaid:
		q.limit = max(q.limit, r.Remaining+1)
	}
	switch {
	case r.Window > 0:
		q.window, q.windowSaid = r.Window, true
	case !q.windowSaid && r.HasReset:
		q.window = max(q.window, r.Reset)
	}
	q.rollLocked(now)
	if sentAt.Before(q.started) {
		return false // the answer to an attempt of a window that has ended
	}
	if !r.HasReset {
		q.remaining = min(q.remaining, r.Remaining) // nothing to wait for unless a window is known
		return r.Remaining == 0 || q.said == nil
	}
	ends, slack := now.Add(r.Reset), q.window/2
	switch {
	case q.resetAt.IsZero() || ends.After(q.resetAt.Add(slack)):
		// A window this client has not counted in: what is left, less the
		// attempts on their way, which the server may not have counted.
		q.resetAt, q.predicted = ends, false
		q.remaining = r.Remaining - q.sending.Load()
		q.anchorLeft, q.anchorAt = r.Remaining, now
		return true
	case ends.Before(q.resetAt.Add(-slack)):
		return false // the answer of an earlier window
	}
	if sentAt.Before(q.anchorAt) && r.Remaining > q.anchorLeft {
		// On its way when the window was first seen, and so taken off it,
		// but counted before that answer (the server's figure only falls
		// within a window): it was in the figure already.
		q.remaining++
	}
	q.remaining = min(q.remaining, r.Remaining)
	kept = r.Remaining == 0 || q.said == nil || q.predicted // the first answer of a window, once per window
	if q.predicted || ends.Before(q.resetAt) {
		q.resetAt, q.predicted = ends, false
	}
	return kept
}

// keep makes a, built outside the lock, the answer *at.
func (q *serverQuota) keep(at **serverAnswer, a *serverAnswer) {
	q.mu.Lock()
	defer q.mu.Unlock()
	*at = a
}

// answer is the answer a refusal at now rests on: the pause's while it
// runs, the window's otherwise.
func (q *serverQuota) answer(now time.Time) *serverAnswer {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.pause.Load(); p != nil && p.After(now) && q.pauseSaid != nil {
		return q.pauseSaid
	}
	return q.said
}

// followsServer reports whether calls under cfg follow the server's quota.
func (cfg *config) followsServer() bool {
	rl := &cfg.RateLimit
	return !rl.Disabled && !rl.IgnoreServerQuota
}

// maxServerWait is the longest pause or reset cfg keeps.
func (cfg *config) maxServerWait() time.Duration {
	if m := cfg.Retry.MaxRetryAfter; m > 0 {
		return m
	}
	return maxServerWait
}

// paceServer admits the call by the quota its upstream announced, waiting
// for the reset or refusing the call as RateLimitOptions.Wait says, and
// reports whether a quota scoped to a resource held it back.
func (c *call) paceServer() (held bool, err error) {
	if !c.cfg.followsServer() {
		return false, nil
	}
	q := &c.s.quota
	for q.active.Load() {
		now := time.Now()
		wait := q.take(now)
		if wait <= 0 {
			c.quotaTaken = true
			break
		}
		if err := c.pace(limitServer, wait, q.answer(now)); err != nil {
			return false, err
		}
	}
	if s := &q.scoped; s.until.Load() != 0 {
		for now := time.Now(); s.maybe(now); now = time.Now() {
			wait, said := s.held(c.req, now)
			if wait <= 0 {
				break
			}
			held = true
			if err := c.pace(limitServer, wait, said); err != nil {
				return held, err
			}
		}
	}
	return held, nil
}

// sendingAttempt notes that an attempt of the call is being sent, a
// retry or hedge or else the call's first, and returns when, or zero if
// the quota is not followed yet. A retry or hedge spends from the quota,
// and so does a first attempt whose call was admitted before the quota was
// followed; the others took their share at admission.
func (c *call) sendingAttempt(retry bool) time.Time {
	if !c.cfg.followsServer() {
		return time.Time{}
	}
	q := &c.s.quota
	q.sending.Add(1)
	if !q.active.Load() {
		return time.Time{}
	}
	now := time.Now()
	if retry || !c.quotaTaken {
		q.spend(now)
	}
	return now
}

// attemptAnswered notes the end of an attempt sendingAttempt returned
// sentAt for, and what its response, if any, says of the quota.
func (c *call) attemptAnswered(sentAt time.Time, resp *http.Response) {
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
