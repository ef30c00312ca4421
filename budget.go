package resilience

import "github.com/resilienthttp/resilience/internal/budget"

// ErrBudgetExhausted is why the retry budget refused a retry: the Err of an
// EventBudgetExceeded, which wraps the outcome not retried, if an error.
// The caller gets that outcome, never this error.
var ErrBudgetExhausted = budget.ErrExhausted
