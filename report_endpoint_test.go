package resilience

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/internal/overload"
)

// Issue 47, item 10: with Endpoints, the Report names the endpoint whose
// answer the caller gets, never the endpoint of an attempt that was not
// sent: a retry or hedge shed by that endpoint's overload limiter, refused
// by its circuit, or refused by the retry budget.

// holdSlot takes the only overload slot of the endpoint at rawURL, with
// h's options, until the test ends.
func holdSlot(t *testing.T, h *Handler, rawURL string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	s := h.hosts.get(u)
	slot, err := s.policies.Load().overload.Acquire(context.Background(), 0, time.Time{}, 1, time.Now())
	require.NoError(t, err)
	t.Cleanup(func() {
		slot.Release(overload.Dropped)
		h.hosts.release(s)
	})
}

// openCircuit opens the circuit of the endpoint at rawURL.
func openCircuit(t *testing.T, h *Handler, rawURL string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	s := h.hosts.get(u)
	s.breaker().Open()
	h.hosts.release(s)
}

// hostOf is the Report's name of the endpoint at rawURL.
func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	return keyOf(u).String()
}

func TestReportNamesTheEndpointThatAnswered(t *testing.T) {
	unavailable := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }
	oneSlot := OverloadOptions{MinLimit: 1, MaxLimit: 1, InitialLimit: 1, MaxQueue: 10, MaxQueueWait: time.Millisecond}
	noDelay := RetryOptions{MaxRetries: 3, Delay: -1, IgnoreRetryAfter: true}
	cases := []struct {
		name    string
		opts    Options
		warmups int                                      // calls made first
		prepare func(t *testing.T, h *Handler, b string) // b: the second endpoint's URL
		flagged func(Report) bool                        // why the call did not go on to b
	}{
		{
			name:    "the retry shed by the next endpoint's limiter",
			opts:    Options{Retry: noDelay, Overload: oneSlot},
			prepare: func(t *testing.T, h *Handler, b string) { holdSlot(t, h, b) },
			flagged: func(r Report) bool { return r.Shed },
		},
		{
			name:    "the hedge shed by the next endpoint's limiter",
			opts:    Options{Hedging: HedgingOptions{Enabled: true, MaxHedges: 1, Delay: time.Hour}, Overload: oneSlot},
			prepare: func(t *testing.T, h *Handler, b string) { holdSlot(t, h, b) },
			flagged: func(r Report) bool { return r.Shed },
		},
		{
			name: "the retry refused by every circuit",
			opts: Options{Retry: noDelay, RetryBudget: RetryBudgetOptions{Disabled: true},
				CircuitBreaker: CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 1, BreakDuration: time.Hour}},
			prepare: func(t *testing.T, h *Handler, b string) { openCircuit(t, h, b) },
			flagged: func(r Report) bool { return r.CircuitRejected },
		},
		{
			name: "the retry refused by the budget",
			opts: Options{Retry: RetryOptions{MaxRetries: 1, Delay: -1, IgnoreRetryAfter: true},
				RetryBudget: RetryBudgetOptions{MaxTokens: 1}, CircuitBreaker: CircuitBreakerOptions{Disabled: true}},
			warmups: 1, // spends the only token on a retry that fails
			flagged: func(r Report) bool { return r.BudgetRefused },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newReplica(t, unavailable)
			b := newReplica(t, unavailable)
			opts := tc.opts
			opts.Endpoints = endpointsOf(a, b)
			h, err := NewHandler(opts)
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()
			for range tc.warmups {
				_, resp, err := failoverGet(t, tr, http.MethodGet)
				require.NoError(t, err)
				readBody(t, resp)
			}
			if tc.prepare != nil {
				tc.prepare(t, h, b.URL)
			}
			bHits := b.hits.Load()

			report, resp, err := failoverGet(t, tr, http.MethodGet)
			require.NoError(t, err, "the call ends on A's answer")
			readBody(t, resp)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, bHits, b.hits.Load(), "nothing was sent to B")
			assert.Equal(t, 1, report.Attempts)
			assert.True(t, tc.flagged(*report), "%+v", *report)
			assert.Equal(t, hostOf(t, a.URL), report.Endpoint, "the endpoint that answered, not %s", hostOf(t, b.URL))
		})
	}
}
