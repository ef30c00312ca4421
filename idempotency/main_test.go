package idempotency_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind; run as a
// child server (see crash_test.go) it serves instead of testing.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m)
}
