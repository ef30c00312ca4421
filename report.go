package resilience

import (
	"context"
	"time"
)

// A Report says what happened to one call. Ask for one with [WithReport];
// RoundTrip fills it in before it returns. It covers every RoundTrip made
// with its context, so every redirect http.Client follows: Attempts and
// Waited add up, the flags are true if they were for any hop, and Endpoint
// and IdempotencyKey are the last hop's.
type Report struct {
	// Attempts is how many attempts were sent; one the circuit refused
	// was not.
	Attempts int

	// Waited is the time spent waiting between attempts, for backoff and
	// Retry-After, for as long as the waits lasted.
	Waited time.Duration

	// BudgetRefused reports that the retry budget refused a retry or
	// hedge: the call ended on the outcome before it.
	BudgetRefused bool

	// CircuitRejected reports that the circuit refused an attempt: the
	// call ended with ErrCircuitOpen, or a hedge was not sent.
	CircuitRejected bool

	// Shed reports that the overload limiter refused the call
	// (ErrOverloaded) or shed a retry or hedge.
	Shed bool

	// Endpoint is the authority (scheme://host[:port]) of the attempt whose
	// outcome the call returned, or of the last one sent.
	Endpoint string

	// IdempotencyKey is the key the attempts carried when Idempotency made
	// the call a keyed write: the caller's own, or the one the handler made.
	IdempotencyKey string
}

// WithReport returns a context whose requests fill in r. Use a fresh Report
// per call, and read it only after RoundTrip or http.Client.Do returns.
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
