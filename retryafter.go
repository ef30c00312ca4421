package resilience

import (
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// ParseRetryAfter returns how long after now a Retry-After value, seconds or
// an HTTP-date, says to wait, and whether it is valid. A past date is no
// wait; one too long for a Duration is the longest.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return headers.ParseRetryAfter(value, now)
}
