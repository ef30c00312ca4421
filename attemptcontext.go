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
	e = Event{Handler: a.c.cfg.Name, Kind: EventAttempt, Attempt: a.n, Delay: a.delay}
	if a.ep != nil {
		a.ep.label(&e) // as EventAttempt says it
	}
	a.c.about(&e)
	return e, true
}
