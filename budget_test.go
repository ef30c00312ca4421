package resilience

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

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

// With every call failing, the budget keeps retries near its share of the
// calls in flight instead of multiplying the load by MaxRetries+1.
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
		if h.budget != nil {
			assert.Zero(t, h.budget.Rate(), "every call and retry released the budget")
		}
		return float64(hits.Load()) / (workers * calls), rec.count(EventBudgetExceeded)
	}
	without, refusedWithout := measure(RetryBudgetOptions{Disabled: true})
	with, refusedWith := measure(RetryBudgetOptions{})
	t.Logf("attempts per call: %.2f without the budget, %.2f with it (%d refusals)", without, with, refusedWith)
	assert.Equal(t, 4.0, without, "without the budget every call makes 1+MaxRetries attempts")
	assert.Zero(t, refusedWithout)
	assert.Less(t, with, 2.0, "the budget refuses most retries")
	assert.Positive(t, refusedWith, "each refusal is an event")
}

// A healthy upstream with occasional failures still gets every retry it
// needs: the budget does not bite at low failure rates.
func TestRetryBudgetAllowsOccasionalRetries(t *testing.T) {
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
	h, err := NewHandler(Options{Retry: quickRetry(), OnEvent: rec.add})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: 16})
	defer tr.CloseIdleConnections()

	const workers, calls = 16, 50
	ok := budgetRun(t, tr, srv.URL, workers, calls)
	assert.EqualValues(t, workers*calls, ok, "every call succeeded")
	assert.Zero(t, rec.count(EventBudgetExceeded), "no retry was refused")
	assert.Positive(t, rec.count(EventRetry))
}

func TestRetryBudgetOptionsInvalid(t *testing.T) {
	for _, o := range []RetryBudgetOptions{{MaxRatio: 1.5}, {MaxRatio: -0.1}, {MinConcurrency: -1}} {
		_, err := NewHandler(Options{RetryBudget: o})
		require.ErrorContains(t, err, "RetryBudget.")
	}
	_, err := NewHandler(Options{RetryBudget: RetryBudgetOptions{MaxRatio: 1, MinConcurrency: 100}})
	require.NoError(t, err)
}
