package server

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// middleware starts none, and every deadline it sets is cancelled.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
