package resilience

import (
	"fmt"
	"net/http"
	"time"
)

// The standard stack, outermost first: admission (concurrency and rate,
// admission.go), total deadline, retry (retry.go; or hedging, hedge.go),
// circuit breaker (internal/breaker), overload limit (internal/overload;
// the slot is admission.go's takeSlot) and one attempt (attempt.go),
// attempt deadline (both deadlines in deadline.go). One call is one *call
// (call.go); its response body, when returned, is the call itself
// (body.go), so that the permit and the timer are released when the
// body is closed or read to EOF. What a call tells its observers and its
// caller is in event.go.

// roundTrip sends req through the stack to base: the Transport's RoundTrip.
func (h *Handler) roundTrip(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	cfg := h.cfg.Load() // one snapshot for the whole call: an Update applies from the next call
	if req.URL == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("resilience: handler %q: nil Request.URL", cfg.Name)
	}
	c := &call{h: h, cfg: cfg, s: h.stateFor(req), base: base, req: req}
	c.owner = c
	if c.hasBody() {
		c.body.Hold(req.Body) // closed at the end if no attempt sends it
	}
	c.attemptLimit, c.totalLimit = max(0, cfg.AttemptTimeout), max(0, cfg.TotalTimeout)
	if o := overridesFrom(req.Context()); o != nil {
		c.over = o
		if o.hasAttempt {
			c.attemptLimit = max(0, o.attempt)
		}
		if o.hasTotal {
			c.totalLimit = max(0, o.total)
		} else if cfg.given.TotalTimeout == 0 && c.attemptLimit > 0 {
			c.totalLimit = max(c.totalLimit, scaled(c.attemptLimit, totalPerAttempt)) // the default yields, as in resolveTimeouts
		}
	}
	c.keyRequest()
	now := time.Now()
	if c.totalLimit > 0 {
		c.totalAt = now.Add(c.totalLimit)
	}
	queued, err := c.admit()
	if err != nil {
		err = c.callerFirst(err)
		c.closeBody()
		if c.heard() {
			c.ended(now, nil, err)
		}
		c.finish()
		return nil, err
	}
	var resp *http.Response
	if cfg.Hedging.Enabled {
		resp, err = c.hedge(now)
	} else {
		first := now
		if queued {
			first = time.Now() // the first attempt starts after the wait
		}
		l := retryLoop{c: c}
		resp, err = l.run(first)
	}
	err = c.callerFirst(err)
	c.closeBody()
	if c.heard() {
		c.ended(now, resp, err)
	}
	if err != nil {
		c.finish()
		if cfg.Fallback.Enabled {
			return c.fallback(err)
		}
		return nil, err
	}
	if cfg.Fallback.Enabled && resp.StatusCode >= 500 {
		if kept, err := c.fallbackOnStatus(resp); kept != resp {
			c.finish()
			return kept, err
		}
	}
	c.deliver(resp)
	return resp, nil
}
