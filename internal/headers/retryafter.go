package headers

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// ParseRetryAfter reads the value of a Retry-After header (RFC 9110
// section 10.2.3): either delta-seconds or an HTTP-date in any of the
// three forms http.ParseTime accepts. It returns how long to wait from now
// and whether the value was valid. A date in the past means no wait; a
// value too large for a time.Duration is clamped to the largest one.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if allDigits(value) {
		var secs int64
		for i := 0; i < len(value); i++ {
			secs = secs*10 + int64(value[i]-'0')
			if secs > math.MaxInt64/int64(time.Second) {
				return time.Duration(math.MaxInt64), true
			}
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// RetryAfter returns the wait a 429 or 503 response asks for, if it asks:
// the first Retry-After field, in any spelling of its name, since a base
// RoundTripper other than net/http's may not canonicalize it.
func RetryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
		return 0, false
	}
	vs := Values(resp.Header, "Retry-After")
	if len(vs) == 0 || vs[0] == "" {
		return 0, false
	}
	return ParseRetryAfter(vs[0], now)
}
