package resilience

import (
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// ParseRetryAfter returns how long from now a Retry-After header's value
// (delta-seconds or an HTTP-date) says to wait, and whether it is valid. A
// date in the past is no wait; a wait too long for a time.Duration is the
// longest one.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return headers.ParseRetryAfter(value, now)
}
