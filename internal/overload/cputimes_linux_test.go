package overload

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSchedstat(t *testing.T) {
	ran, waited, ok := parseSchedstat([]byte("3324369180 5246799589 6874\n"))
	require.True(t, ok)
	assert.Equal(t, 3324369180*time.Nanosecond, ran)
	assert.Equal(t, 5246799589*time.Nanosecond, waited)
	for _, bad := range []string{"", "12", "12 ", "12 x 3\n", "-1 2 3\n", "1,2 3 4\n"} {
		_, _, ok := parseSchedstat([]byte(bad))
		assert.False(t, ok, "%q", bad)
	}
}

// The process's own threads have run: cpuTimes reads them.
func TestCPUTimes(t *testing.T) {
	_, ran, ok := cpuTimes()
	require.True(t, ok, "/proc/self/task/*/schedstat")
	assert.Positive(t, ran)
}
