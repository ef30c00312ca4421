package server

import "time"

// EventKind says why a request was refused.
type EventKind int

// Event kinds: one event per refused request.
const (
	EventExpired      EventKind = iota + 1 // its budget was spent or under MinBudget
	EventRetryRefused                      // a retry, with the retried share above RetryShare
	EventOverloaded                        // MaxConcurrent reached (for a retry, less the reserve)
)

var eventKindNames = [...]string{
	EventExpired:      "expired",
	EventRetryRefused: "retry_refused",
	EventOverloaded:   "overloaded",
}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// An Event describes one refused request.
type Event struct {
	Kind     EventKind
	Attempt  int           // the request's attempt number; 0 if it had no valid one
	Budget   time.Duration // its budget (clamped); 0 if none, or spent (EventExpired)
	Share    float64       // the retried share of the requests served over Window; 0 with RetryShare off
	InFlight int           // the requests being served, this one not among them
	Stop     bool          // the answer carried the pushback stop: do not retry
}
