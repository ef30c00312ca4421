package resilience

import "github.com/resilienthttp/resilience/internal/budget"

// ErrBudgetExhausted is why the retry budget refused a retry (or a hedge
// that follows a failure): the Err of an EventBudgetExceeded is, for
// errors.Is, this error, and it wraps the outcome that was not retried, if
// an error. The caller gets that outcome, never this error.
var ErrBudgetExhausted = budget.ErrExhausted
