package resilience

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/resilienthttp/resilience/internal/redact"
)

// ErrIsolated is why Handler.IsolateCircuit's circuit is open, in its events
// and under ErrCircuitOpen.
var ErrIsolated = errors.New("resilience: isolated by IsolateCircuit")

// Bounds of the text an open circuit keeps to say why it opened. The reason
// is in every rejection error, every log line about the circuit and the
// health report, and its parts come from the upstream (a status line may be
// up to 10 MB long, net/http's limit on headers) or from error texts of any
// length. A status line or error worth reading fits in a few hundred bytes;
// the whole reason, a summary and up to len(failureLog.recent) such texts
// with their counts, stays under a couple of KiB, small enough to log on
// every rejection.
const (
	maxFailureText = 256     // bytes of one remembered failure
	maxReasonText  = 2 << 10 // bytes of the whole reason
)

// failureLog keeps the last failures the circuit breaker counted, so that an
// open circuit can say why it opened. It is touched only on failures and
// transitions, never on the success path.
type failureLog struct {
	mu     sync.Mutex
	recent [8]string // ring of failure descriptions
	next   int
	count  int
	reason error // why the circuit last opened
}

func (l *failureLog) record(resp *http.Response, err error) {
	d := describe(resp, err)
	l.mu.Lock()
	l.recent[l.next] = d
	l.next = (l.next + 1) % len(l.recent)
	l.count = min(l.count+1, len(l.recent))
	l.mu.Unlock()
}

// reset forgets the failures recorded so far.
func (l *failureLog) reset() {
	l.mu.Lock()
	l.next, l.count = 0, 0
	l.mu.Unlock()
}

// describe returns the text the failure log keeps for a failure: URL
// secrets redacted, control characters escaped, and bounded, so that texts
// equal within the bound count as one.
func describe(resp *http.Response, err error) string {
	switch {
	case errors.Is(err, ErrAttemptTimeout):
		return "attempt timeout"
	case err != nil:
		return redact.Text(redact.Error(err), maxFailureText)
	case resp != nil:
		return redact.Text(resp.Status, maxFailureText)
	}
	return "failure"
}

// opened builds and keeps the reason the circuit opened from the failures
// seen last, most frequent first (the most recent first among equals).
func (l *failureLog) opened(summary string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		order  []string
		counts = map[string]int{}
	)
	for i := 0; i < l.count; i++ {
		d := l.recent[(l.next-1-i+len(l.recent))%len(l.recent)]
		if counts[d] == 0 {
			order = append(order, d)
		}
		counts[d]++
	}
	sort.SliceStable(order, func(i, j int) bool { return counts[order[i]] > counts[order[j]] })
	var b strings.Builder
	b.WriteString(summary)
	if len(order) > 0 {
		b.WriteString("; last failures: ")
		for i, d := range order {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (x%d)", d, counts[d])
		}
	}
	l.reason = &openReason{msg: redact.Cut(b.String(), maxReasonText)}
	return l.reason
}

func (l *failureLog) lastReason() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// openReason says why a circuit opened.
type openReason struct{ msg string }

func (r *openReason) Error() string { return r.msg }
