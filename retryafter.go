package resilience

import (
	"net/http"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// ParseRetryAfter returns how long after now a Retry-After value, seconds or
// an HTTP-date, says to wait, and whether it is valid. A past date is no
// wait; one too long for a Duration is the longest.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return headers.ParseRetryAfter(value, now)
}

// serverWait returns the wait resp asks for before the request is sent to
// its server again: its Retry-After (a keyed call's 409's too), or the
// deadline contract's pushback where that asks for longer; asked is false
// when it asks for none, or IgnoreRetryAfter is set. ok is false when the
// wait is not to be made at all (over MaxRetryAfter): the caller gets resp
// at once, or, with Endpoints, the request goes elsewhere. Whether the wait
// fits the call's deadline is the caller's to judge. The retry loop
// (nextDelay) and the hedging race (hedgePauses) both ask it.
func (c *call) serverWait(resp *http.Response, now time.Time) (d time.Duration, asked, ok bool) {
	r := c.cfg.Retry
	if r.IgnoreRetryAfter {
		return 0, false, true
	}
	d, asked = headers.RetryAfter(resp, now)
	if !asked && c.keyed {
		d, asked = conflictRetryAfter(resp, now)
	}
	if p, stop, pok := pushbackOf(resp, c.cfg.Propagation); pok && !stop && (!asked || p > d) {
		d, asked = p, true // the contract's pushback, where it asks for longer
	}
	if asked && r.MaxRetryAfter > 0 && d > r.MaxRetryAfter {
		return 0, true, false
	}
	return d, asked, true
}
