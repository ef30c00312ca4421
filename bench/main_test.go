package bench

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the module's tests leave no goroutine behind. When
// benchmarks run it does not: some peers leak by design (failsafehttp keeps
// the goroutines of responses it never closes), and the faults experiment
// reports those leaks as its result rather than failing on them.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
