package resilience

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: timers,
// attempt contexts, connections and drains must all end with the call.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
