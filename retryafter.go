package resilience

import (
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// ParseRetryAfter reads the value of a Retry-After header (RFC 9110
// section 10.2.3): either delta-seconds or an HTTP-date in any of the
// three forms http.ParseTime accepts. It returns how long to wait from now
// and whether the value was valid. A date in the past means no wait; a
// value too large for a time.Duration is clamped to the largest one.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return headers.ParseRetryAfter(value, now)
}
