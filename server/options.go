package server

import (
	"fmt"
	"math"
	"time"

	"github.com/resilienthttp/resilience/internal/contract"
)

// Headers names the fields of the contract. Budget and Attempt are read
// from requests, Pushback is written on the answers that refuse a retry.
// Each empty field is the neutral default's name: the zero Headers is
// DefaultHeaders.
type Headers struct {
	Budget   string // the milliseconds the attempt may take; default Request-Budget-Ms
	Attempt  string // the attempt number, 1 for the first; default Request-Attempt
	Pushback string // written "-1" (do not retry) on refusals; default Retry-Pushback-Ms
}

// DefaultHeaders returns the neutral names, without an X- prefix:
// Request-Budget-Ms, Request-Attempt and Retry-Pushback-Ms.
func DefaultHeaders() Headers {
	return Headers{Budget: contract.BudgetHeader, Attempt: contract.AttemptHeader, Pushback: contract.PushbackHeader}
}

// EnvoyHeaders returns Envoy's names for the budget and the attempt
// number, X-Envoy-Expected-Rq-Timeout-Ms and X-Envoy-Attempt-Count, and the
// neutral Retry-Pushback-Ms for the pushback, which Envoy has no header
// for.
func EnvoyHeaders() Headers {
	return Headers{Budget: contract.EnvoyBudgetHeader, Attempt: contract.EnvoyAttemptHeader, Pushback: contract.PushbackHeader}
}

// Options configure the middleware. Every zero field means its default.
type Options struct {
	// Headers names the fields read and written. Default DefaultHeaders();
	// EnvoyHeaders() for Envoy's names.
	Headers Headers

	// MinBudget is the floor under which a request's budget is too small
	// to be useful: such a request is refused before any work. A budget of
	// 0, spent, is always refused. Negative: only a spent budget is
	// refused. At most a day (the largest budget read). Default 5ms.
	MinBudget time.Duration

	// RetryShare is the share of retried requests, among those served over
	// Window, above which retried requests are refused (once at least 20
	// were served in the window). Between 0 and 1; negative: never refuse
	// for the share. Default 0.1 (Google SRE book, "Handling Overload").
	RetryShare float64

	// Window is how far back the retried share is measured, in ten
	// buckets of a tenth of it each. Zero or at least 10ms. Default 1s.
	Window time.Duration

	// MaxConcurrent bounds the requests in flight. A retried request is
	// refused once MaxConcurrent minus a reserve are in flight, the reserve
	// (MaxConcurrent/10, at least 1 but less than MaxConcurrent) kept for
	// first attempts; a first attempt is refused at MaxConcurrent. Zero or
	// more. Default 0: no limit.
	MaxConcurrent int

	// OnEvent, when set, is called on every refusal, synchronously on the
	// request's goroutine and possibly from many at once: it must be fast
	// and safe for concurrent use. Default: no observer.
	OnEvent func(Event)
}

const (
	defaultMinBudget  = 5 * time.Millisecond
	defaultRetryShare = 0.1
	defaultWindow     = time.Second
	minWindow         = 10 * time.Millisecond
)

func invalid(field string, value any, reason string) error {
	return fmt.Errorf("resilience: server: invalid option %s (%v): %s", field, value, reason)
}

// resolve checks o and fills in its defaults.
func (o Options) resolve() (Options, error) {
	names := contract.Names(o.Headers)
	if field, value, reason := names.Resolve(); field != "" {
		return o, invalid("Headers."+field, fmt.Sprintf("%q", value), reason)
	}
	o.Headers = Headers(names)
	switch {
	case o.MinBudget == 0:
		o.MinBudget = defaultMinBudget
	case o.MinBudget < 0:
		o.MinBudget = 0
	case o.MinBudget > contract.MaxBudget:
		return o, invalid("MinBudget", o.MinBudget, fmt.Sprintf("above the largest budget read (%v): every budget would be refused", contract.MaxBudget))
	}
	switch {
	case math.IsNaN(o.RetryShare) || o.RetryShare > 1:
		return o, invalid("RetryShare", o.RetryShare, "want a share between 0 and 1, or negative (off)")
	case o.RetryShare == 0:
		o.RetryShare = defaultRetryShare
	}
	switch {
	case o.Window == 0:
		o.Window = defaultWindow
	case o.Window < minWindow:
		return o, invalid("Window", o.Window, fmt.Sprintf("want zero (the default) or at least %v", minWindow))
	}
	if o.MaxConcurrent < 0 {
		return o, invalid("MaxConcurrent", o.MaxConcurrent, "want zero (no limit) or more")
	}
	return o, nil
}
