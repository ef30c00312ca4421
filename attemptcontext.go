package resilience

import (
	"context"
)

// AttemptFromContext reports which attempt of a call ctx belongs to, for the
// context of an attempt's request a Handler with OnEvent or Logger sends: an
// EventAttempt as it is about to be sent, with Duration, StatusCode and Err
// zero; otelresilience gives each attempt a client span by it. For any other
// context, ok is false.
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
