package resilience

import (
	"errors"

	"github.com/failsafe-go/failsafe-go/budget"
)

// retryBudget is failsafe-go's budget seen through the methods its retry
// and hedge executors use: they are exported by its implementation, though
// its public interface names only Rate.
type retryBudget interface {
	RecordExecution()  // a call starts
	ReleaseExecution() // a call ends
	TryAcquirePermit() bool
	ReleasePermit()
	Rate() float64
}

func newRetryBudget(ratio float64, minimum int) (retryBudget, error) {
	b, ok := budget.NewBuilder().WithMaxRate(ratio).WithMinConcurrency(uint(minimum)).Build().(retryBudget)
	if !ok {
		// Only a failsafe-go upgrade that hides these methods gets here; the
		// tests catch it before a release does.
		return nil, errors.New("resilience: this failsafe-go's budget does not expose its permits")
	}
	return b, nil
}
