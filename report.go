package resilience

import (
	"context"
	"time"
)

// A Report says what happened to a call made with [WithReport]'s context,
// every redirect http.Client follows included: Attempts and Waited add up,
// flags are true if true for any hop, the strings are the last hop's.
type Report struct {
	Attempts        int           // how many attempts were sent
	Waited          time.Duration // time spent waiting between attempts
	BudgetRefused   bool          // the retry budget refused a retry or hedge
	CircuitRejected bool          // the circuit refused an attempt
	Shed            bool          // the overload limiter refused an attempt
	Endpoint        string        // scheme://host[:port] the outcome came from
	IdempotencyKey  string        // the key of a keyed write
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
