package resilience

import "time"

// hedgePauses is what the failures of a hedged call asked of its next
// hedges, as a Retry-After (or a pushback) asks of a retry (serverWait
// decides for both): a hedge to the server that asked waits until the time
// it named, and one that asked for a wait the call cannot make (over
// MaxRetryAfter, or ending past the call's deadline) gets no hedge again.
// Without Endpoints that server is the request's host, where every hedge
// goes; with them each endpoint speaks for itself: a hedge goes to another
// at once, and waits only when every endpoint left asked for a wait. A call
// has none until a failure asks for a wait: a race without one pays
// nothing for it.
type hedgePauses struct {
	until  []time.Time // per endpoint (one entry without Endpoints): no hedge to it before
	barred bool        // without Endpoints: no hedge may go at all
}

// heed notes what h, a handled failure, asks of the next hedges to its
// server, and returns p, made if it was nil and o asks for a wait. An
// endpoint that asked for a wait the call cannot make is dropped from the
// call's route.
func (c *call) heed(p *hedgePauses, rt *route, h *hedge) *hedgePauses {
	if h.out.resp == nil {
		return p
	}
	now := time.Now()
	d, asked, ok := c.serverWait(h.out.resp, now)
	if !asked {
		return p
	}
	if deadline := c.deadline(); ok && !deadline.IsZero() && !now.Add(d).Before(deadline) {
		ok = false
	}
	if !ok && rt != nil {
		rt.drop(h.idx)
		return p
	}
	if p == nil {
		n := 1
		if rt != nil {
			n = len(rt.r.eps)
		}
		p = &hedgePauses{until: make([]time.Time, n)}
	}
	if !ok {
		p.barred = true
		return p
	}
	i := 0
	if rt != nil {
		i = h.idx
	}
	if at := now.Add(d); at.After(p.until[i]) {
		p.until[i] = at
	}
	return p
}

// wait returns how long the next hedge has to wait for the server it
// would go to (0: it may go now), or false when no hedge may go. With
// Endpoints, the route passes over the endpoints still waited for while
// another is open, and the next hedge goes to the one ahead.
func (p *hedgePauses) wait(rt *route, h *Handler, now time.Time) (time.Duration, bool) {
	switch {
	case p == nil:
		return 0, true
	case p.barred:
		return 0, false
	case rt == nil:
		return max(0, p.until[0].Sub(now)), true
	}
	rt.paused = 0
	for i, at := range p.until {
		if at.After(now) {
			rt.paused |= 1 << i
		}
	}
	open := (uint32(1)<<len(rt.r.eps) - 1) &^ rt.dropped
	if i := rt.drawn - 1; i >= 0 && rt.paused&(1<<i) != 0 && open&^rt.paused != 0 {
		rt.drawn = 0 // drawn before it asked for a wait: draw again, elsewhere
	}
	i := rt.ahead(h)
	if i < 0 {
		return 0, false
	}
	return max(0, p.until[i].Sub(now)), true
}
