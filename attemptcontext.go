package resilience

import (
	"context"
)

// AttemptFromContext reports which attempt of a call ctx belongs to: for
// the context of a request a Handler with OnEvent or Logger set sends to its
// base RoundTripper (or one made from it), an Event of kind EventAttempt as
// the attempt is about to be sent, with Duration, StatusCode and Err zero.
// It is how a base tells a call's attempts apart, as otelresilience does to
// give each one a client span. For any other context, ok is false: a
// handler without observers pays nothing for it.
func AttemptFromContext(ctx context.Context) (e Event, ok bool) {
	a, ok := ctx.Value(attemptKey{}).(*attemptContext)
	if !ok {
		return Event{}, false
	}
	c := a.c
	e = Event{
		Handler: c.cfg.Name,
		Host:    c.s.host,
		Kind:    EventAttempt,
		Method:  c.req.Method,
		Attempt: a.n,
		Delay:   a.delay,
		Context: c.req.Context(),
		req:     c.req,
	}
	if a.ep != nil {
		e.Endpoint, e.Host = a.ep.base, a.ep.url.String() // as EventAttempt says them
	}
	return e, true
}
