package resilience

import (
	"context"
	"fmt"
	"time"
)

// A Report says what happened to a call made with [WithReport]'s context,
// every redirect http.Client follows included: Attempts and Waited add up,
// flags are true if true for any hop, Outcome, StatusCode and the strings
// are the last hop's. It is complete when RoundTrip returns: a body read
// the total timeout cuts later fails with ErrTotalTimeout, and changes
// nothing in it.
type Report struct {
	Outcome         Outcome       // why the call ended
	StatusCode      int           // the status of the response the call ended on; 0 for none
	Attempts        int           // how many attempts were sent
	Waited          time.Duration // time spent waiting between attempts
	BudgetRefused   bool          // the retry budget refused a retry or hedge
	CircuitRejected bool          // the circuit refused an attempt
	Shed            bool          // the overload limiter refused an attempt
	Endpoint        string        // scheme://host[:port] the outcome came from
	IdempotencyKey  string        // the key of a keyed write
}

// An Outcome says why a call ended: on a response, and whether the retry
// layer accepts it, or on which failure. Its String names it as the
// ErrorType method of the error RoundTrip returns does, where both name
// the same failure ("circuit_open", "rate_limited", "overloaded",
// "total_timeout", "attempt_timeout", "canceled", "deadline_exceeded"),
// so that logs, metrics and Reports agree.
//
// A call that ends on a response a retry would have followed tells why no
// retry was made in the Report's flags: BudgetRefused, CircuitRejected,
// Shed; otherwise the retries ran out, the request was not one to repeat,
// or the Retry-After asked for did not fit. With Fallback, a kept response
// may answer a call in its place: Outcome is still how the call ended.
type Outcome int

// Outcomes of a call.
const (
	OutcomeNone             Outcome = iota // the zero Report's: the call has not returned
	OutcomeSuccess                         // a response the retry layer accepts (a 404 is one: the upstream answered)
	OutcomeFailureStatus                   // a response the retry layer would retry, such as a 503 (StatusCode): no retry followed
	OutcomeAttemptTimeout                  // the last attempt got no headers within AttemptTimeout
	OutcomeTotalTimeout                    // the call ran past TotalTimeout before it had a response
	OutcomeCircuitOpen                     // the circuit refused the call, with no answer to give
	OutcomeOverloaded                      // the overload limiter refused the call
	OutcomeRateLimited                     // admission control refused the call: concurrency, a rate, the server's quota
	OutcomeCanceled                        // the caller cancelled the request
	OutcomeDeadlineExceeded                // the request context's own deadline passed
	OutcomeRequestFault                    // the request itself failed: its body's reader, a length mismatch, a malformed request
	OutcomeTransportError                  // the last attempt failed without a response: refused, reset, TLS, the base's own timeouts
)

var outcomeNames = [...]string{
	OutcomeNone:             "none",
	OutcomeSuccess:          "success",
	OutcomeFailureStatus:    "failure_status",
	OutcomeAttemptTimeout:   "attempt_timeout",
	OutcomeTotalTimeout:     "total_timeout",
	OutcomeCircuitOpen:      "circuit_open",
	OutcomeOverloaded:       "overloaded",
	OutcomeRateLimited:      "rate_limited",
	OutcomeCanceled:         "canceled",
	OutcomeDeadlineExceeded: "deadline_exceeded",
	OutcomeRequestFault:     "request_fault",
	OutcomeTransportError:   "transport_error",
}

func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// MarshalText returns the outcome's name, as String does, so that a Report
// logged as JSON names it.
func (o Outcome) MarshalText() ([]byte, error) {
	if o < 0 || int(o) >= len(outcomeNames) {
		return nil, fmt.Errorf("resilience: unknown outcome %d", int(o))
	}
	return []byte(outcomeNames[o]), nil
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
