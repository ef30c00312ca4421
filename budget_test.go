package resilience

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// budgetRun sends calls GETs from workers goroutines through tr and returns
// how many got a 200.
func budgetRun(t *testing.T, tr http.RoundTripper, url string, workers, calls int) int64 {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				status, err := cbCall(t.Context(), tr, fmt.Sprintf("%s/%d-%d", url, w, i), false)
				if err == nil && status == http.StatusOK {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return ok.Load()
}

func TestRetryBudgetBucket(t *testing.T) {
	b := newRetryBudget(10, 0.1)
	assert.True(t, b.allow(), "full at first")
	for range 5 {
		b.failed()
	}
	assert.Equal(t, 5.0, b.level())
	assert.False(t, b.allow(), "at half, no more retries")
	b.succeeded()
	assert.InDelta(t, 5.1, b.level(), 1e-9)
	assert.True(t, b.allow(), "above half again")
	for range 100 {
		b.failed()
	}
	assert.Zero(t, b.level(), "never below empty")
	for range 1000 {
		b.succeeded()
	}
	assert.Equal(t, 10.0, b.level(), "never above full")

	// Concurrent use keeps the count exact.
	b = newRetryBudget(1000, 0.5)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.failed()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 200.0, b.level())
}

// With every call failing, the budget stops retrying after a handful of
// failures instead of multiplying the load by MaxRetries+1.
func TestRetryBudgetStopsRetryStorm(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "0")
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	measure := func(budget RetryBudgetOptions) (float64, int) {
		hits.Store(0)
		rec := &evRecorder{}
		h, err := NewHandler(Options{
			Retry:          quickRetry(),
			CircuitBreaker: CircuitBreakerOptions{Disabled: true},
			RetryBudget:    budget,
			OnEvent:        rec.add,
		})
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: 32})
		defer tr.CloseIdleConnections()
		const workers, calls = 32, 10
		budgetRun(t, tr, srv.URL, workers, calls)
		return float64(hits.Load()) / (workers * calls), rec.count(EventBudgetExceeded)
	}
	without, refusedWithout := measure(RetryBudgetOptions{Disabled: true})
	with, refusedWith := measure(RetryBudgetOptions{})
	t.Logf("attempts per call: %.2f without the budget, %.2f with it (%d refusals)", without, with, refusedWith)
	assert.Equal(t, 4.0, without, "without the budget every call makes 1+MaxRetries attempts")
	assert.Zero(t, refusedWithout)
	// The bucket lets at most MaxTokens/2 failures be retried before it
	// closes, however the calls interleave: 320 calls make at most
	// 320 + 3*5 attempts.
	assert.LessOrEqual(t, with, 1.05, "the budget refuses nearly every retry")
	assert.Positive(t, refusedWith, "each refusal is an event")
}

// A healthy upstream with occasional failures still gets every retry it
// needs, at any traffic: the budget follows the failure rate, not how many
// calls are in flight, and not how long the retries wait.
func TestRetryBudgetAllowsOccasionalRetries(t *testing.T) {
	for _, tc := range []struct {
		name           string
		workers, calls int
		retry          RetryOptions
	}{
		{"busy, quick retries", 16, 50, quickRetry()},
		{"light, slow retries", 1, 60, RetryOptions{Delay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if hits.Add(1)%20 == 0 { // one request in twenty fails
					http.Error(w, "blip", http.StatusServiceUnavailable)
					return
				}
				_, _ = io.WriteString(w, "ok")
			}))
			defer srv.Close()
			rec := &evRecorder{}
			h, err := NewHandler(Options{Retry: tc.retry, OnEvent: rec.add})
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: 16})
			defer tr.CloseIdleConnections()

			ok := budgetRun(t, tr, srv.URL, tc.workers, tc.calls)
			assert.EqualValues(t, tc.workers*tc.calls, ok, "every call succeeded")
			assert.Zero(t, rec.count(EventBudgetExceeded), "no retry was refused")
			assert.Positive(t, rec.count(EventRetry))
		})
	}
}

func TestRetryBudgetOptionsInvalid(t *testing.T) {
	for _, o := range []RetryBudgetOptions{{MaxTokens: -1}, {MaxTokens: 1001}, {TokenRatio: -0.1}, {TokenRatio: 1.5}, {TokenRatio: 0.0001}} {
		_, err := NewHandler(Options{RetryBudget: o})
		require.ErrorContains(t, err, "RetryBudget.")
	}
	h, err := NewHandler(Options{RetryBudget: RetryBudgetOptions{MaxTokens: 1000, TokenRatio: 1}})
	require.NoError(t, err)
	assert.Equal(t, 1000.0, h.budget.level())
	h, err = NewHandler(Options{})
	require.NoError(t, err)
	assert.Equal(t, float64(DefaultBudgetTokens), h.budget.level())
}
