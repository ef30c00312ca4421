package redislimit

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(fleetChild())
	}
	goleak.VerifyTestMain(m)
}
