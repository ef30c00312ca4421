package resilience

import (
	"net/http"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/internal/contract"
	"github.com/resilienthttp/resilience/internal/headers"
)

// The client half of the deadline and retry contract
// (PropagationOptions): the budget and the number an attempt carries, and
// the pushback its response may carry.

// stamp writes on r, attempt n's request, its number and its budget, in a
// header of its own: the caller's is never changed. Any spelling of the two
// names the caller set is replaced.
func (c sending) stamp(r *http.Request, n int) {
	names := c.cfg.Propagation.Headers
	h := make(http.Header, len(c.req.Header)+2)
	for k, vs := range c.req.Header {
		if !strings.EqualFold(k, names.Budget) && !strings.EqualFold(k, names.Attempt) {
			h[k] = vs
		}
	}
	h[names.Attempt] = []string{contract.FormatAttempt(n)}
	if budget, ok := c.attemptBudget(time.Now()); ok {
		h[names.Budget] = []string{contract.FormatBudget(budget)}
	}
	r.Header = h
}

// attemptBudget is how long an attempt sent at now may take: until the
// earliest of its attempt deadline, the total deadline and the request
// context's, or false when none applies.
func (c *call) attemptBudget(now time.Time) (time.Duration, bool) {
	at := c.deadline()
	if d := c.attemptLimit; d > 0 {
		if a := now.Add(d); at.IsZero() || a.Before(at) {
			at = a
		}
	}
	if at.IsZero() {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// pushback reads resp's pushback, when the contract is on: stop for "do
// not retry", or a wait before the next attempt; ok is false for none (or
// a malformed one, which says nothing).
func (c *call) pushback(resp *http.Response) (wait time.Duration, stop, ok bool) {
	if !c.cfg.Propagation.Enabled || resp == nil {
		return 0, false, false
	}
	return contract.ParsePushback(headers.Values(resp.Header, c.cfg.Propagation.Headers.Pushback))
}
