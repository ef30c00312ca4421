package resilience

import (
	"context"
	"time"
)

// A Report says what happened to one call: how many attempts it took, how
// long it waited between them, and whether the retry budget or the circuit
// cut it short. Ask for one by making the request with a context from
// WithReport; RoundTrip fills it in before it returns. A call made without
// one pays nothing for it.
//
// A Report covers the whole exchange made with its context: every
// RoundTrip, so every hop of the redirects http.Client follows. Attempts
// and Waited add up over the hops; BudgetRefused and CircuitRejected are
// true when they were for any hop; Endpoint names the last hop's endpoint,
// the one whose answer (or failure) the caller got, and IdempotencyKey the
// last key sent.
type Report struct {
	// Attempts is how many attempts were sent (an attempt the circuit
	// refused was not sent).
	Attempts int

	// Waited is the time spent waiting between attempts, for backoff
	// delays and Retry-After: as long as the waits lasted, so a wait the
	// caller cut short counts for the part it waited.
	Waited time.Duration

	// BudgetRefused reports that the retry budget refused a retry (or a
	// hedge that follows a failure): the call ended on the outcome before it.
	BudgetRefused bool

	// CircuitRejected reports that the circuit refused an attempt: the
	// call ended with ErrCircuitOpen, or, with hedging, a hedge was not sent.
	CircuitRejected bool

	// Shed reports that the overload limiter refused the call (it ended
	// with ErrOverloaded) or shed a retry or hedge (a shed retry ends the
	// call on the outcome before it).
	Shed bool

	// Endpoint is the authority (scheme://host[:port]) of the last hop's
	// attempts; with Hedging.Endpoints, that of the endpoint whose outcome
	// the call returned (or of the last attempt sent).
	Endpoint string

	// IdempotencyKey is the key the attempts carried, when the handler's
	// Idempotency options made the call a keyed write: the caller's own, or
	// the one the handler made. Log it to reconcile with the upstream.
	IdempotencyKey string
}

// WithReport returns a context whose requests fill in r when their
// RoundTrip returns. Use a fresh Report per request, and read it only after
// RoundTrip (or http.Client.Do) has returned.
func WithReport(ctx context.Context, r *Report) context.Context {
	return withOverride(ctx, func(o *overrides) { o.report = r })
}

// note updates the report from an event of its call.
func (r *Report) note(e Event) {
	switch e.Kind {
	case EventBudgetExceeded:
		r.BudgetRefused = true
	case EventCircuitRejected:
		r.CircuitRejected = true
	case EventOverloadShed:
		r.Shed = true
	}
}
