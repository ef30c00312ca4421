package resilience

import (
	"github.com/resilienthttp/resilience/internal/budget"
)

// ErrBudgetExhausted is the Err of an EventBudgetExceeded, wrapping the
// error not retried, if any; the caller gets that outcome, not this error.
var ErrBudgetExhausted = budget.ErrExhausted
