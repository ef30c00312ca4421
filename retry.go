package resilience

import (
	"encoding/json"
	"errors"
	"fmt"
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
	var prevResp *http.Response // the outcome before attempt n, for a retry the overload limiter sheds
	var prevErr error
	for n := 1; ; n++ {
		if n > 1 {
			now = time.Now()
		}
		resp, err, final := sending(c).attempt(now, waited, rt)
		if final {
			if n > 1 && c.budget() != nil {
				c.budget().Release() // never judged: its claim says nothing
			}
			if se, ok := err.(*shedError); ok {
				if prevResp == nil && prevErr == nil {
					return nil, c.errorf(nil, se.OverloadError, "") // the response before was too long to keep
				}
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
		// endpoint (failover) waits the backoff only.
		wait, ok := c.nextDelay(n, resp, err, rt != nil && rt.ahead(c.h) != rt.last)
		if !ok {
			return c.result(resp, err) // the wait asked for does not fit: answer now
		}
		if why := c.budget().Refuses(); why != nil {
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
// resp's Retry-After does not apply to it.
func (c retryLoop) nextDelay(n int, resp *http.Response, err error, elsewhere bool) (time.Duration, bool) {
	r := c.cfg.Retry
	if c.delays == nil {
		c.delays = newBackOff(r)
	}
	wait := min(c.delays.NextBackOff(), r.MaxDelay)
	now := time.Now()
	honoured := false
	if !r.IgnoreRetryAfter && !elsewhere {
		d, ok := headers.RetryAfter(resp, now)
		if !ok && c.keyed {
			d, ok = conflictRetryAfter(resp, now)
		}
		if ok {
			if r.MaxRetryAfter > 0 && d > r.MaxRetryAfter {
				return 0, false
			}
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

// Defaults of RetryOptions: what a zero field means.
const (
	defaultMaxRetries    = 3
	defaultRetryDelay    = 2 * time.Second
	defaultMaxRetryDelay = 30 * time.Second
)

// RetryOptions configures the retry layer, which retries the transient
// failures of requests safe to repeat. A retry waits for a delay or a 429's
// or 503's Retry-After, unless the wait would end past the call's deadline:
// the caller then gets the failed attempt's outcome. See docs/retries.md.
type RetryOptions struct {
	Disabled   bool // turns retries off; default false
	MaxRetries int  // repeats after the first attempt; default 3

	// Delay is the base delay between attempts. Default 2s; negative means
	// none: retries go at once, whatever Backoff and MaxDelay say.
	Delay time.Duration

	MaxDelay time.Duration // caps the computed delay; default 30s
	Backoff  BackoffType   // how the delay grows; default BackoffExponential
	NoJitter bool          // turns off the ±50% jitter; default false

	// Methods adds methods to those retried, only GET by default, and
	// ExcludeMethods removes some, GET included. The rule holds for every
	// outcome; WithRetryable overrides it for one request.
	Methods        []string
	ExcludeMethods []string

	// IgnoreRetryAfter makes retries wait the computed delay instead of a
	// Retry-After; after one over MaxRetryAfter, the caller gets the response
	// at once. Default false, and 0: no cap.
	IgnoreRetryAfter bool
	MaxRetryAfter    time.Duration

	// ShouldRetry, if set, replaces the default [IsTransient], for hedges too.
	// It must be safe for concurrent use, and must not modify or keep the
	// request, nor read or close the response body.
	ShouldRetry func(req *http.Request, resp *http.Response, err error) bool

	// DelayFunc, if set, returns each retry's delay, not capped by MaxDelay;
	// negative keeps the computed delay, the default. An honoured Retry-After
	// wins. It must be safe for concurrent use and return quickly.
	DelayFunc func(DelayInfo) time.Duration
}

// retryFields decode into the whole fileOptions, for maxRetries' sake.
var retryFields = fieldSet[fileOptions]{
	"disabled":   boolField(func(o *fileOptions) *bool { return &o.Retry.Disabled }),
	"maxRetries": maxRetriesField,
	"delay":      retryDelayField,
	"maxDelay": durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxDelay },
		keepZero),
	"backoff":          backoffField,
	"noJitter":         boolField(func(o *fileOptions) *bool { return &o.Retry.NoJitter }),
	"methods":          stringsField(func(o *fileOptions) *[]string { return &o.Retry.Methods }),
	"excludeMethods":   stringsField(func(o *fileOptions) *[]string { return &o.Retry.ExcludeMethods }),
	"ignoreRetryAfter": boolField(func(o *fileOptions) *bool { return &o.Retry.IgnoreRetryAfter }),
	"maxRetryAfter":    durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxRetryAfter }, keepZero),
}

// maxRetriesField reads retry.maxRetries; a written 0 meant no retries.
var maxRetriesField = intField(func(o *fileOptions) *int { return &o.Retry.MaxRetries },
	refuseZero("no retries", `"disabled": true`))

// retryDelayField reads retry.delay; a written 0 meant no delay.
var retryDelayField = durationField(func(o *fileOptions) *time.Duration { return &o.Retry.Delay },
	refuseZero("no delay", `a negative duration such as "-1s" for no delay`))

func backoffField(o *fileOptions, raw json.RawMessage, path string) error {
	var s string
	_ = json.Unmarshal(raw, &s)
	for _, b := range []BackoffType{BackoffExponential, BackoffLinear, BackoffConstant} {
		if s == b.String() {
			o.Retry.Backoff = b
			return nil
		}
	}
	return configErr(path, "want \"exponential\", \"linear\" or \"constant\", got %s", brief(raw))
}

// resolveRetry fills in the retry layer's defaults and validates it.
func resolveRetry(r *RetryOptions, bad badOption) error {
	switch {
	case r.MaxRetries < 0:
		return bad("Retry.MaxRetries", r.MaxRetries, "must not be negative; set Retry.Disabled to turn retries off")
	case r.MaxDelay < 0:
		return bad("Retry.MaxDelay", r.MaxDelay, "must not be negative")
	case r.Backoff < BackoffExponential || r.Backoff > BackoffConstant:
		return bad("Retry.Backoff", r.Backoff, "must be BackoffExponential, BackoffLinear or BackoffConstant")
	case r.MaxRetryAfter < 0:
		return bad("Retry.MaxRetryAfter", r.MaxRetryAfter, "must not be negative; zero means no cap but TotalTimeout")
	}
	if r.MaxRetries == 0 {
		r.MaxRetries = defaultMaxRetries
	}
	if r.Delay == 0 {
		r.Delay = defaultRetryDelay
		if r.MaxDelay > 0 {
			r.Delay = min(r.Delay, r.MaxDelay) // the default yields to a shorter MaxDelay
		}
	}
	if r.MaxDelay > 0 && r.Delay > r.MaxDelay {
		return bad("Retry.MaxDelay", r.MaxDelay, fmt.Sprintf("must not be below Retry.Delay (%v)", r.Delay))
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = max(defaultMaxRetryDelay, r.Delay)
	}
	return nil
}
