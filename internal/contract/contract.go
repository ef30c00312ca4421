// Package contract holds what the two halves of the deadline and retry
// contract (docs/deadline-contract.md) share: the header names and the
// codecs of their values. The client half writes a request's budget and
// attempt number and reads a response's pushback; the server half reads the
// first two and writes the third. Every value parsed
// here is a peer's bytes: each parser takes exactly one field value of at
// most MaxValueLength bytes and ASCII digits only, so that no input costs
// more than a few comparisons and none can overflow.
package contract

import (
	"strconv"
	"time"
)

// The neutral header names, without an X- prefix (RFC 6648).
const (
	// BudgetHeader carries, on a request, the milliseconds this attempt
	// may take: a non-negative decimal integer.
	BudgetHeader = "Request-Budget-Ms"
	// AttemptHeader carries, on a request, the attempt number: 1 for the
	// first, 2 for the first retry.
	AttemptHeader = "Request-Attempt"
	// PushbackHeader carries, on a response, gRPC's retry pushback: a
	// non-negative integer asks the client to retry no sooner than that
	// many milliseconds; a negative one (PushbackStop) asks it not to
	// retry at all.
	PushbackHeader = "Retry-Pushback-Ms"
)

// Envoy's names for the budget and the attempt number, for a service behind
// or in front of Envoy. Envoy has no pushback response header: a program
// that uses these keeps PushbackHeader for the pushback.
const (
	EnvoyBudgetHeader  = "X-Envoy-Expected-Rq-Timeout-Ms"
	EnvoyAttemptHeader = "X-Envoy-Attempt-Count"
)

// Bounds on what is read.
const (
	// MaxBudget is the largest budget (and pushback wait) a value is read
	// as: a larger one is clamped to it. A day is longer than any
	// request's deadline, and small enough that no arithmetic on it can
	// overflow.
	MaxBudget = 24 * time.Hour
	// MaxAttempt is the largest attempt number read; a larger one is not
	// valid.
	MaxAttempt = 1000
	// MaxValueLength bounds a value, in bytes: 19 digits, as many as an
	// int64 holds. A longer value is not valid, whatever it says.
	MaxValueLength = 19
)

// PushbackStop is the pushback value that asks the client not to retry.
const PushbackStop = "-1"

const maxBudgetMs = int64(MaxBudget / time.Millisecond)

// digits reads s as a decimal integer of 1 to MaxValueLength ASCII digits:
// no sign, no space, no other byte. A value above limit reads as limit+1,
// so that nothing overflows whatever the digits.
func digits(s string, limit int64) (int64, bool) {
	if s == "" || len(s) > MaxValueLength {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= limit {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, limit+1), true
}

// ParseBudget reads the values of a budget header (BudgetHeader or
// EnvoyBudgetHeader). It is ok only for exactly one value of 1 to
// MaxValueLength ASCII digits; a budget above MaxBudget is clamped to it.
// "0" is valid: a budget already spent.
func ParseBudget(values []string) (time.Duration, bool) {
	if len(values) != 1 {
		return 0, false
	}
	ms, ok := digits(values[0], maxBudgetMs)
	if !ok {
		return 0, false
	}
	return min(time.Duration(ms)*time.Millisecond, MaxBudget), true
}

// FormatBudget writes d as a budget value: whole milliseconds, rounded
// down, and never negative. A budget under a millisecond is "0": spent.
func FormatBudget(d time.Duration) string {
	return strconv.FormatInt(int64(max(d, 0)/time.Millisecond), 10)
}

// ParseAttempt reads the values of an attempt header (AttemptHeader or
// EnvoyAttemptHeader). It is ok only for exactly one value of ASCII digits
// between 1 and MaxAttempt.
func ParseAttempt(values []string) (int, bool) {
	if len(values) != 1 {
		return 0, false
	}
	n, ok := digits(values[0], MaxAttempt)
	if !ok || n < 1 || n > MaxAttempt {
		return 0, false
	}
	return int(n), true
}

// FormatAttempt writes n as an attempt value, within 1 and MaxAttempt.
func FormatAttempt(n int) string {
	return strconv.Itoa(min(max(n, 1), MaxAttempt))
}

// ParsePushback reads the values of a pushback header. A value of ASCII
// digits is a wait (clamped to MaxBudget); a minus sign followed by ASCII
// digits is stop, do not retry. It is ok only for exactly one value of one
// of those two forms. gRPC reads a value it cannot parse as stop too;
// ParsePushback reports it as not ok, and leaves that choice to its caller.
func ParsePushback(values []string) (wait time.Duration, stop bool, ok bool) {
	if len(values) != 1 {
		return 0, false, false
	}
	v := values[0]
	if len(v) > 1 && v[0] == '-' {
		if _, ok := digits(v[1:], 0); !ok {
			return 0, false, false
		}
		return 0, true, true
	}
	ms, ok := digits(v, maxBudgetMs)
	if !ok {
		return 0, false, false
	}
	return min(time.Duration(ms)*time.Millisecond, MaxBudget), false, true
}

// FormatPushback writes a wait as a pushback value: whole milliseconds,
// rounded down, and never negative (PushbackStop is the value for stop).
func FormatPushback(wait time.Duration) string {
	return FormatBudget(wait)
}
