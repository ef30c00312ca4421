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
type Report struct {
	// Attempts is how many attempts were sent (an attempt the circuit
	// refused was not sent).
	Attempts int

	// Waited is the sum of the waits between attempts: backoff delays and
	// Retry-After.
	Waited time.Duration

	// BudgetRefused reports that the retry budget refused a retry (or a
	// hedge): the call ended on the outcome before it.
	BudgetRefused bool

	// CircuitRejected reports that the circuit refused an attempt: the
	// call ended with ErrCircuitOpen, or, with hedging, a hedge was not sent.
	CircuitRejected bool

	// Endpoint is the authority (scheme://host[:port]) the attempts went to;
	// with Hedging.Endpoints, that of the endpoint whose outcome the call
	// returned (or of the last attempt sent).
	Endpoint string

	// IdempotencyKey is the key every attempt carried, when the handler's
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
	case EventRetry:
		r.Waited += e.Delay
	case EventBudgetExceeded:
		r.BudgetRefused = true
	case EventCircuitRejected:
		r.CircuitRejected = true
	}
}
