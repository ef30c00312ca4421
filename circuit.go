package resilience

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/resilienthttp/resilience/internal/redact"
)

// The circuit breaker layer, the root's side of it: its options, and what
// the root tells the breaker of a failure (describe). The breaker itself,
// its probe and its open reason are internal/breaker's.

// ErrIsolated is why Handler.IsolateCircuit's circuit is open, in its events
// and under ErrCircuitOpen.
var ErrIsolated = errors.New("resilience: isolated by IsolateCircuit")

// maxFailureText bounds the text a failure the circuit breaker counts
// leaves for the reason it opens with: a status line may be up to 10 MB
// long (net/http's limit on headers), and error texts any length, but a
// status line or error worth reading fits in a few hundred bytes.
const maxFailureText = 256

// describe returns the text the failure log keeps for a failure of a
// request to u (nil: none known): URL secrets redacted (u's too, wherever
// the error's text quotes it), control characters escaped, and bounded, so
// that texts equal within the bound count as one.
func describe(resp *http.Response, err error, u *url.URL) string {
	switch {
	case errors.Is(err, ErrAttemptTimeout):
		return "attempt timeout"
	case err != nil:
		return redact.Text(redact.Known(redact.Error(err), u), maxFailureText)
	case resp != nil:
		return redact.Text(resp.Status, maxFailureText)
	}
	return "failure"
}
