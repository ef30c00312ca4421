package resilience

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 29, item 6: a retry refused after the upstream answered ends the
// call on that answer, whoever refuses it: the circuit that the answer
// just opened, the retry budget, or (hedging) the circuit asked for the
// next hedge. The caller gets the 503 with its headers and body, a nil
// error, and a Report that says who refused. Before, a circuit that
// opened on the 503 replaced it with ErrCircuitOpen.
func TestRefusedRetryEndsOnTheAnswerBefore(t *testing.T) {
	const body = "busy, come back later\n"
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("X-Answer", strconv.Itoa(n))
		http.Error(w, strings.TrimSuffix(body, "\n"), http.StatusServiceUnavailable)
	})
	opensOnOneFailure := CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 1, BreakDuration: time.Hour}
	cases := []struct {
		name    string
		opts    Options
		warmups int               // calls made first, with the same handler
		refused func(Report) bool // the flag that says who refused
	}{
		{
			name:    "the circuit opened on the 503",
			opts:    Options{Retry: quickRetry(), RetryBudget: RetryBudgetOptions{Disabled: true}, CircuitBreaker: opensOnOneFailure},
			refused: func(r Report) bool { return r.CircuitRejected },
		},
		{
			name: "the retry budget refused the retry",
			opts: Options{Retry: RetryOptions{MaxRetries: 1, Delay: time.Millisecond, MaxDelay: time.Millisecond, NoJitter: true},
				RetryBudget: RetryBudgetOptions{MaxTokens: 1}, CircuitBreaker: CircuitBreakerOptions{Disabled: true}},
			warmups: 1, // spends the only token on a retry that fails
			refused: func(r Report) bool { return r.BudgetRefused },
		},
		{
			name:    "hedging: the circuit opened on the 503",
			opts:    Options{Hedging: HedgingOptions{Enabled: true, MaxHedges: 2, Delay: time.Hour}, CircuitBreaker: opensOnOneFailure},
			refused: func(Report) bool { return true }, // an open circuit gets no hedge: nothing is asked
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up.requests.Store(0)
			h, err := NewHandler(tc.opts)
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()
			for range tc.warmups {
				resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
				require.NoError(t, err)
				readBody(t, resp)
			}
			before := up.requests.Load()

			var r Report
			resp, err := tr.RoundTrip(newTestRequest(t, WithReport(context.Background(), &r), http.MethodGet, up.URL(), nil))
			require.NoError(t, err, "the upstream answered: its answer, not the refusal")
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, strconv.Itoa(int(before)+1), resp.Header.Get("X-Answer"), "the answer to the call's one attempt")
			assert.Equal(t, body, readBody(t, resp), "its body, intact")
			assert.EqualValues(t, before+1, up.requests.Load(), "the retry was not sent")
			assert.Equal(t, 1, r.Attempts)
			assert.True(t, tc.refused(r), "the Report says who refused: %+v", r)
		})
	}
}

// Issue 29, item 6: when the answer before a retry the circuit refuses was
// too long to keep while the retry waited (its body over
// httpbody.MaxDrainBytes), there is no answer left to give: the caller gets
// the refusal, ErrCircuitOpen, as when the overload limiter sheds such a
// retry.
func TestRefusedRetryAfterAnAnswerTooLongToKeep(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(make([]byte, 1<<20))
	})
	h, err := NewHandler(Options{Retry: quickRetry(), RetryBudget: RetryBudgetOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 1, BreakDuration: time.Hour}})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	var r Report
	resp, err := tr.RoundTrip(newTestRequest(t, WithReport(context.Background(), &r), http.MethodGet, up.URL(), nil))
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.EqualValues(t, 1, up.requests.Load())
	assert.Equal(t, 1, r.Attempts)
	assert.True(t, r.CircuitRejected)
}
