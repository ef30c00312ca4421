package resilience

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
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
			// the budget alone: the overload limiter would shed these
			// retries too, every attempt being a 503
			Overload:    OverloadOptions{Disabled: true},
			RetryBudget: budget,
			OnEvent:     rec.add,
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
	// The bucket lets MaxTokens failed retries through before it closes,
	// and at most one more per caller checked at the same moment: 320 calls
	// make at most 320 + 20 + 32 attempts.
	assert.LessOrEqual(t, with, 1+float64(defaultBudgetTokens+32)/320, "the budget refuses nearly every retry")
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
	for _, o := range []RetryBudgetOptions{{MaxTokens: -1}, {MaxTokens: 0.5}, {MaxTokens: 1001}, {TokenRatio: -0.1}, {TokenRatio: 1.5}, {TokenRatio: 0.0001}, {RetrySuccessTokens: -1}, {RetrySuccessTokens: 1e4}} {
		_, err := NewHandler(Options{RetryBudget: o})
		require.ErrorContains(t, err, "RetryBudget.")
	}
	h, err := NewHandler(Options{RetryBudget: RetryBudgetOptions{MaxTokens: 1000, TokenRatio: 1}})
	require.NoError(t, err)
	assert.Equal(t, 1000.0, h.budget.Level())
	h, err = NewHandler(Options{})
	require.NoError(t, err)
	assert.Equal(t, float64(defaultBudgetTokens), h.budget.Level())
}

// A sparse caller whose every call needs two retries is never refused: its
// retries succeed, and a successful retry pays for the failed one.
func TestRetryBudgetSparseCallerNeverRefused(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%3 != 0 { // each call's first two attempts fail
			http.Error(w, "blip", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	rec := &evRecorder{}
	h, err := NewHandler(Options{Retry: quickRetry(), OnEvent: rec.add})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	ok := budgetRun(t, tr, srv.URL, 1, 40)
	assert.EqualValues(t, 40, ok, "every call succeeded on its third attempt")
	assert.Zero(t, rec.count(EventBudgetExceeded))
	assert.Equal(t, CircuitClosed, h.CircuitState(), "two failures in three attempts is not a dead upstream")
}

// A burst of simultaneous failures (one HTTP/2 connection dropping, a
// deploy) fails many first attempts at once; those cost nothing, and every
// one of them is retried: jitter spreads the retries, and each that succeeds
// frees its token for the next. (Without jitter, MaxTokens retries go at a
// time: the herd the budget bounds.)
func TestRetryBudgetBurstOfSimultaneousFailures(t *testing.T) {
	const callers = 64
	var hits atomic.Int64
	arrived := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := hits.Add(1); n <= callers {
			if n == callers {
				once.Do(func() { close(arrived) })
			}
			select { // every first attempt fails together
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Error("the 64 first attempts never were in flight together")
			}
			http.Error(w, "connection lost", http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	rec := &evRecorder{}
	// Jitter spreads the 64 retries over [250ms, 750ms]: even at 150 ms a
	// retry (a loaded machine, -race), fewer than MaxTokens are in flight.
	// The overload limiter is off: it would queue first attempts over its
	// initial limit (20), and this upstream fails them only when all 64
	// are in flight at once.
	h, err := NewHandler(Options{Retry: RetryOptions{Delay: 500 * time.Millisecond}, Overload: OverloadOptions{Disabled: true}, OnEvent: rec.add})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: callers})
	defer tr.CloseIdleConnections()

	ok := budgetRun(t, tr, srv.URL, callers, 1)
	assert.EqualValues(t, callers, ok)
	assert.Zero(t, rec.count(EventBudgetExceeded), "no retry of the burst was refused")
	assert.Equal(t, float64(defaultBudgetTokens), h.budget.Level())
}

// An upstream failing 70% of attempts at random is not down: retries that
// succeed three times in ten keep the budget full, and the circuit closed.
// The same seeded traffic from one caller with the budget and the breaker
// off serves exactly as many calls.
func TestRetryBudgetAndBreakerLeavePartialFailureToRetries(t *testing.T) {
	serve := func(opts Options) (ok int64, rec *evRecorder) {
		var mu sync.Mutex
		rnd := rand.New(rand.NewPCG(7, 70))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			fail := rnd.Float64() < 0.7
			mu.Unlock()
			if fail {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
		}))
		defer srv.Close()
		rec = &evRecorder{}
		opts.Retry, opts.OnEvent = quickRetry(), rec.add
		h, err := NewHandler(opts)
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{})
		defer tr.CloseIdleConnections()
		return budgetRun(t, tr, srv.URL, 1, 100), rec
	}
	bare, _ := serve(Options{RetryBudget: RetryBudgetOptions{Disabled: true}, CircuitBreaker: CircuitBreakerOptions{Disabled: true}})
	ok, rec := serve(Options{})
	assert.Equal(t, bare, ok, "the defaults serve what retries alone serve")
	assert.Greater(t, ok, int64(70))
	assert.Zero(t, rec.count(EventBudgetExceeded))
	assert.Zero(t, rec.count(EventCircuitOpened), "70% failing is not down")
}

// A dead upstream opens the circuit once MinimumThroughput attempts have
// failed; then calls fail fast until a probe succeeds.
func TestRetryBudgetBreakerOpensForDeadUpstream(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rec := &evRecorder{}
	h, err := NewHandler(Options{Retry: quickRetry(), OnEvent: rec.add})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	ok := budgetRun(t, tr, srv.URL, 1, 200)
	assert.Zero(t, ok)
	assert.Equal(t, 1, rec.count(EventCircuitOpened), "opened once, and the break outlasts the test's calls")
	assert.Equal(t, CircuitOpen, h.CircuitState())
	assert.LessOrEqual(t, hits.Load(), int64(defaultMinimumThroughput+defaultBudgetTokens+1),
		"MinimumThroughput attempts, the budget's retries, then nothing: %d attempts for 200 calls", hits.Load())
}

// Retries that fail slowly (an upstream that hangs until the attempt
// timeout) cannot overrun the budget while their outcome is unknown: each
// claims its token when it is sent, so at most MaxTokens are in flight.
func TestRetryBudgetBoundsSlowFailingRetries(t *testing.T) {
	const callers = 64
	var hits, inflight, peak atomic.Int64
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		n := inflight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		defer inflight.Add(-1)
		select { // a black hole
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer srv.Close()
	defer close(stop)
	h, err := NewHandler(Options{
		AttemptTimeout:       50 * time.Millisecond,
		StrictAttemptTimeout: true, // cut at its limit though nothing overtook it
		Retry:                RetryOptions{Delay: time.Millisecond},
		CircuitBreaker:       CircuitBreakerOptions{Disabled: true},
		// the budget alone: the overload limiter queues first attempts
		// over its initial limit (20) and sheds retries after timeouts
		Overload: OverloadOptions{Disabled: true},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: callers})
	defer tr.CloseIdleConnections()

	budgetRun(t, tr, srv.URL, callers, 1)
	assert.LessOrEqual(t, hits.Load(), int64(callers+defaultBudgetTokens),
		"64 first attempts and at most MaxTokens retries, not 64 x 4")
	assert.Zero(t, h.budget.Level())
	assert.True(t, h.budget.InFlight() == 0, "every claim settled")
}

// The budget is asked again when a retry's wait ends: retries that failed
// meanwhile may have emptied it. A call refused then answers with the
// response it waited on, kept in memory, untouched.
func TestRetryBudgetAskedAgainAfterTheWait(t *testing.T) {
	var aHits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/a" {
			aHits.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "a is busy", http.StatusServiceUnavailable)
			return
		}
		http.Error(w, "b is busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rec := &evRecorder{}
	h, err := NewHandler(Options{
		Retry:          quickRetry(),
		RetryBudget:    RetryBudgetOptions{MaxTokens: 1},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	type answer struct {
		resp *http.Response
		err  error
	}
	a := make(chan answer, 1)
	go func() {
		resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, srv.URL+"/a", nil))
		a <- answer{resp, err}
	}()
	require.Eventually(t, func() bool { return aHits.Load() == 1 }, 5*time.Second, time.Millisecond)
	// b spends the only token on a retry that fails, while a waits out its
	// Retry-After.
	resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, srv.URL+"/b", nil))
	require.NoError(t, err)
	readBody(t, resp)

	got := <-a
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusServiceUnavailable, got.resp.StatusCode)
	assert.Equal(t, "1", got.resp.Header.Get("Retry-After"))
	assert.Equal(t, "a is busy\n", readBody(t, got.resp), "the response a waited on, intact")
	assert.EqualValues(t, 1, aHits.Load(), "a was not retried")
	assert.Equal(t, 2, rec.count(EventBudgetExceeded), "b's second retry, and a after its wait")
}

// Issue 18, item 8: speculative hedges are not the retry budget's to count
// or refuse (MaxExtraLoad bounds them): 16 concurrent callers with 3 hedges
// each, every attempt held until all 64 have arrived and then answered
// with a 200, get every hedge they ask for, and the budget stays full.
// Before, each hedge claimed a token, and the 48 hedges in flight were
// refused past 25 "because recent retries failed".
func TestRetryBudgetLeavesSuccessfulHedgesAlone(t *testing.T) {
	const callers, hedges = 16, 3
	var arrived atomic.Int64
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == callers*(1+hedges) {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(5 * time.Second): // only when hedges were refused
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging: HedgingOptions{Enabled: true, MaxHedges: hedges, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
		// the budget alone: the overload limiter would hold attempts over
		// its initial limit (20), and this upstream answers only when all
		// 64 are in flight at once
		Overload: OverloadOptions{Disabled: true},
		OnEvent:  rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hedgeGet(t, tr, http.MethodGet, srv.URL, nil)
			if assert.NoError(t, err) {
				assert.Equal(t, "ok", readBody(t, resp))
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, rec.count(EventBudgetExceeded), "no hedge refused by the budget")
	assert.EqualValues(t, callers*(1+hedges), arrived.Load())
	assert.Equal(t, callers*hedges, rec.count(EventHedge))
	assert.Equal(t, float64(defaultBudgetTokens), tr.Handler().budget.Level(), "nothing failed: the bucket is full")
}

// Issue 18, item 8: through the retry loop: call a's retry holds the one
// token, and call b's first attempt fails meanwhile. b is refused because
// a's retry is in flight, not because any retry failed, and says so.
func TestRetryBudgetRefusalInFlightSaysSo(t *testing.T) {
	var hits atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch hits.Add(1) {
		case 2: // a's retry
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "ok")
		default:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:       RetryOptions{Delay: time.Millisecond},
		RetryBudget: RetryBudgetOptions{MaxTokens: 1},
		OnEvent:     rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	a := make(chan *http.Response, 1)
	go func() {
		resp, err := hedgeGet(t, tr, http.MethodGet, srv.URL, nil)
		assert.NoError(t, err)
		a <- resp
	}()
	for hits.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	resp, err := hedgeGet(t, tr, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp.Body.Close()
	close(release)
	if resp := <-a; resp != nil {
		assert.Equal(t, "ok", readBody(t, resp))
	}
	refusals := rec.of(EventBudgetExceeded)
	require.Len(t, refusals, 1)
	msg := refusals[0].Err.Error()
	assert.Contains(t, msg, "claimed by one of the 1 retries in flight")
	assert.NotContains(t, msg, "retries failed", "no retry had failed")
	assert.ErrorIs(t, refusals[0].Err, ErrBudgetExhausted)
}
