package resilience

import (
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// ParseRetryAfter returns how long after now a Retry-After value says to
// wait (none for a past date; the longest Duration for too long), and
// whether it is valid.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return headers.ParseRetryAfter(value, now)
}
