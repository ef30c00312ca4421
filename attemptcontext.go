package resilience

import (
	"context"
	"time"
)

// AttemptFromContext reports which attempt of a call ctx belongs to. For the
// context of a request that a Handler sends to its base RoundTripper, or any
// context made from it, it returns an Event of kind EventAttempt as the
// attempt is about to be sent: Handler, Method, Attempt (counting from 1,
// hedges included), Delay (the wait before it, as EventAttempt reports it),
// Host and Endpoint (for an attempt routed by Hedging.Endpoints), and Context,
// the caller's request's; Duration, StatusCode and Err are zero, for nothing
// has happened yet. For any other context ok is false.
//
// It exists because nothing else reaches the RoundTripper that sends an
// attempt: the attempt's request is the caller's, retargeted, and its events
// come after it. A base that must tell a call's attempts apart, as
// otelresilience does to give each attempt a client span with its resend
// count and to put its trace context in the attempt's headers, reads it from
// the request's context.
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

// An attemptContext is the context of an attempt's request: the attempt's
// own context, which it forwards everything to, and what AttemptFromContext
// says of the attempt. One allocation per attempt carries both, where
// context.WithValue would take two.
type attemptContext struct {
	context.Context
	c     *call
	n     int
	delay time.Duration
	ep    *endpoint // nil unless routed by Hedging.Endpoints
}

type attemptKey struct{}

func (a *attemptContext) Value(key any) any {
	if key == (attemptKey{}) {
		return a
	}
	return a.Context.Value(key)
}
