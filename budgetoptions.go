package resilience

import "math"

// Defaults of RetryBudgetOptions: what a zero field means.
const (
	defaultBudgetTokens       = 25
	defaultBudgetTokenRatio   = 0.2
	defaultBudgetRetrySuccess = 6
)

// RetryBudgetOptions configures the retry budget of a handler's calls and
// hosts: a bucket of MaxTokens tokens, full at first. A retry, or a hedge
// after a failure, needs an unclaimed token and takes it if it fails; one
// that succeeds puts back RetrySuccessTokens, a successful first attempt
// TokenRatio. A call refused a retry ends on its last outcome. See
// docs/retries.md.
type RetryBudgetOptions struct {
	Disabled           bool    // turns the budget off; default false
	MaxTokens          float64 // in [1, 1000]; default 25
	TokenRatio         float64 // in [0.001, 1]; default 0.2
	RetrySuccessTokens float64 // in (0, 1000]; default 6
}

var retryBudgetFields = fieldSet[RetryBudgetOptions]{
	"disabled": boolField(func(o *RetryBudgetOptions) *bool { return &o.Disabled }),
	"maxTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.MaxTokens },
		keepZero),
	"tokenRatio": floatField(func(o *RetryBudgetOptions) *float64 { return &o.TokenRatio },
		keepZero),
	"retrySuccessTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.RetrySuccessTokens },
		keepZero),
}

// resolveRetryBudget fills in the retry budget's defaults and validates it.
func resolveRetryBudget(rb *RetryBudgetOptions, bad badOption) error {
	switch {
	case math.IsNaN(rb.MaxTokens) || rb.MaxTokens < 0 || rb.MaxTokens > 1000 || (rb.MaxTokens > 0 && rb.MaxTokens < 1):
		return bad("RetryBudget.MaxTokens", rb.MaxTokens, "must be in [1, 1000]: a retry needs a whole token")
	case math.IsNaN(rb.RetrySuccessTokens) || rb.RetrySuccessTokens < 0 || rb.RetrySuccessTokens > 1000:
		return bad("RetryBudget.RetrySuccessTokens", rb.RetrySuccessTokens, "must be in (0, 1000]")
	case math.IsNaN(rb.TokenRatio) || rb.TokenRatio < 0 || rb.TokenRatio > 1:
		return bad("RetryBudget.TokenRatio", rb.TokenRatio, "must be in (0, 1]")
	case rb.TokenRatio > 0 && rb.TokenRatio < 0.001:
		return bad("RetryBudget.TokenRatio", rb.TokenRatio, "must be at least 0.001")
	}
	if rb.MaxTokens == 0 {
		rb.MaxTokens = defaultBudgetTokens
	}
	if rb.TokenRatio == 0 {
		rb.TokenRatio = defaultBudgetTokenRatio
	}
	if rb.RetrySuccessTokens == 0 {
		rb.RetrySuccessTokens = defaultBudgetRetrySuccess
	}
	return nil
}
