package resilience

import (
	"net/http"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/internal/contract"
	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/server"
)

// The client half of the deadline and retry contract
// (PropagationOptions): the budget and the number an attempt carries, and
// the pushback its response may carry.

// stamp returns a copy of h, the caller's header, that carries attempt n's
// number and, when ok, its budget under names: the caller's header is
// never changed. Any spelling of the two names h holds is replaced.
func stamp(h http.Header, names server.Headers, n int, budget time.Duration, ok bool) http.Header {
	out := make(http.Header, len(h)+2)
	for k, vs := range h {
		if !strings.EqualFold(k, names.Budget) && !strings.EqualFold(k, names.Attempt) {
			out[k] = vs
		}
	}
	out[names.Attempt] = []string{contract.FormatAttempt(n)}
	if ok {
		out[names.Budget] = []string{contract.FormatBudget(budget)}
	}
	return out
}

// pushbackOf reads resp's pushback when p is on: stop for "do not retry", or
// a wait before the next attempt; ok is false for none (or a malformed
// one, which says nothing).
func pushbackOf(resp *http.Response, p PropagationOptions) (wait time.Duration, stop, ok bool) {
	if !p.Enabled || resp == nil {
		return 0, false, false
	}
	return contract.ParsePushback(headers.Values(resp.Header, p.Headers.Pushback))
}
