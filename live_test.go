package resilience

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveRetryOptions retries up to maxRetries times, 1ms apart, and opens no
// circuit: the tests count attempts.
func liveRetryOptions(maxRetries int, rec *evRecorder) Options {
	r := quickRetry()
	r.MaxRetries = maxRetries
	return Options{Name: "live", Retry: r, OnEvent: rec.add}
}

// Issue 13, live configuration: an update takes effect for the next call,
// while a call in flight finishes under the options it started with. The
// upstream holds the first call's first attempt until the update is made;
// its retries come after it.
func TestUpdateAppliesToTheNextCallNotToOneInFlight(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	defer up.unblock()
	before, after := &evRecorder{measures: true}, &evRecorder{measures: true}
	h, err := NewHandler(liveRetryOptions(3, before))
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := h.Transport(base)

	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, err := cbCall(context.Background(), tr, up.URL, true)
		done <- result{status, err}
	}()
	up.waitArrived(t)
	require.NoError(t, h.Update(liveRetryOptions(1, after)))
	up.unblock()

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "retries ran out on a response")
	assert.EqualValues(t, 4, up.hits.Load(), "the call in flight made its 1+3 attempts")
	calls := before.of(EventCall)
	require.Len(t, calls, 1, "its events went to the observer it started with")
	assert.Equal(t, 4, calls[0].Attempt)
	assert.Equal(t, 3, before.count(EventRetry))

	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.EqualValues(t, 6, up.hits.Load(), "the next call made 1+1 attempts")
	calls = after.of(EventCall)
	require.Len(t, calls, 1, "the next call's events went to the new observer")
	assert.Equal(t, 2, calls[0].Attempt)
	assert.Len(t, before.of(EventCall), 1)
}

// liveBreakerOptions opens the circuit after 2 failed attempts in 2, for
// breakDuration; retries are off.
func liveBreakerOptions(rec *evRecorder, breakDuration time.Duration) Options {
	o := cbOptions(rec, breakDuration)
	o.CircuitBreaker.MinimumThroughput = 2
	return o
}

// liveOpen trips h's circuit (through tr) and checks that it is open.
func liveOpen(t *testing.T, h *Handler, tr http.RoundTripper, up *cbUpstream) {
	t.Helper()
	cbTrip(t, tr, up, 2)
	require.Equal(t, CircuitOpen, h.CircuitState())
}

// liveRejected checks that a call through tr is refused by the open circuit
// without reaching the upstream.
func liveRejected(t *testing.T, tr http.RoundTripper, up *cbUpstream) {
	t.Helper()
	hits := up.hits.Load()
	_, err := cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, hits, up.hits.Load(), "the rejected call reached the upstream")
}

// Issue 13: an open circuit stays open across a compatible update, one
// that keeps the breaker and one that replaces it.
func TestUpdateKeepsAnOpenCircuitOpen(t *testing.T) {
	t.Run("retry and timeouts", func(t *testing.T) {
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, cbLongBreak))
		require.NoError(t, err)
		tr := h.Transport(nil)
		liveOpen(t, h, tr, up)
		breaker := h.shared.breaker()

		o := liveBreakerOptions(rec, cbLongBreak)
		o.Retry = RetryOptions{MaxRetries: 1}
		o.TotalTimeout = 5 * time.Second
		require.NoError(t, h.Update(o))
		assert.Equal(t, CircuitOpen, h.CircuitState())
		assert.Same(t, breaker, h.shared.breaker(), "nothing of the breaker changed: it is kept")
		liveRejected(t, tr, up)
		assert.Equal(t, 1, rec.count(EventCircuitOpened))
	})

	t.Run("breaker thresholds", func(t *testing.T) {
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, cbLongBreak))
		require.NoError(t, err)
		tr := h.Transport(nil)
		liveOpen(t, h, tr, up)
		reason := openReason(h)

		o := liveBreakerOptions(rec, cbLongBreak)
		o.CircuitBreaker.FailureRatio = 0.9
		o.CircuitBreaker.MinimumThroughput = 10
		o.CircuitBreaker.SamplingDuration = 2 * time.Second
		require.NoError(t, h.Update(o))
		assert.Equal(t, CircuitOpen, h.CircuitState(), "the new breaker carries the open state")
		liveRejected(t, tr, up)
		assert.Equal(t, reason, openReason(h), "and the reason it opened")
		assert.Equal(t, []EventKind{EventCircuitOpened, EventCircuitRejected}, rec.kinds(),
			"carrying the state is not a new opening")
	})

	t.Run("a shorter break", func(t *testing.T) {
		// At most the new BreakDuration: the circuit half-opens well before
		// the hour the old one had left, and a probe closes it.
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, time.Hour))
		require.NoError(t, err)
		tr := h.Transport(nil)
		liveOpen(t, h, tr, up)

		require.NoError(t, h.Update(liveBreakerOptions(rec, time.Millisecond)))
		up.status.Store(http.StatusOK)
		cbWaitHalfOpen(t, h)
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, CircuitClosed, h.CircuitState())
	})

	t.Run("a longer break", func(t *testing.T) {
		// For the rest of its break: a circuit with cbShortBreak left does
		// not stay open for the new hour.
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, cbShortBreak))
		require.NoError(t, err)
		tr := h.Transport(nil)
		liveOpen(t, h, tr, up)

		require.NoError(t, h.Update(liveBreakerOptions(rec, time.Hour)))
		require.NotEqual(t, CircuitClosed, h.CircuitState())
		up.status.Store(http.StatusOK)
		cbWaitHalfOpen(t, h)
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, CircuitClosed, h.CircuitState())
		assert.Equal(t, 1, rec.count(EventCircuitHalfOpened), "the carried break's end is reported")
		assert.Equal(t, 1, rec.count(EventCircuitClosed))
	})

	t.Run("disabled", func(t *testing.T) {
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, cbLongBreak))
		require.NoError(t, err)
		tr := h.Transport(nil)
		liveOpen(t, h, tr, up)

		o := liveBreakerOptions(rec, cbLongBreak)
		o.CircuitBreaker.Disabled = true
		require.NoError(t, h.Update(o))
		assert.Equal(t, CircuitClosed, h.CircuitState(), "no breaker, no open circuit")
		assert.Equal(t, 1, rec.count(EventCircuitClosed), "and observers are told")
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, status)
	})
}

// A half-open circuit whose probe is in flight stays so across an update
// that replaces the breaker: no second probe is let through, and the probe's
// outcome decides the new breaker.
func TestUpdateKeepsTheProbeInFlight(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	h, err := NewHandler(liveBreakerOptions(rec, time.Millisecond))
	require.NoError(t, err)
	tr := h.Transport(nil)
	cbTrip(t, tr, up, 2)
	cbWaitHalfOpen(t, h)

	up.status.Store(http.StatusOK)
	probe := make(chan error, 1)
	go func() {
		_, err := cbCall(context.Background(), tr, up.URL, true)
		probe <- err
	}()
	up.waitArrived(t)
	o := liveBreakerOptions(rec, time.Hour) // a probe may run an hour before another goes
	o.CircuitBreaker.FailureRatio = 0.9
	require.NoError(t, h.Update(o))
	assert.Equal(t, CircuitHalfOpen, h.CircuitState())
	liveRejected(t, tr, up)

	up.unblock()
	require.NoError(t, <-probe)
	assert.Equal(t, CircuitClosed, h.CircuitState(), "the probe's success closed the new breaker")
	assert.EqualValues(t, 3, up.hits.Load(), "two trips and one probe")
}

// An update that resolve rejects, or that the running handler cannot take,
// is an error naming the field, and changes nothing.
func TestUpdateRejectsInvalidOptionsAndChangesNothing(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	o := liveBreakerOptions(rec, cbLongBreak)
	h, err := NewHandler(o)
	require.NoError(t, err)
	tr := h.Transport(nil)
	liveOpen(t, h, tr, up)
	cfg, pol := h.cfg.Load(), h.shared.policies.Load()

	for _, tc := range []struct {
		field  string
		change func(*Options)
	}{
		{"Retry.MaxRetries", func(o *Options) { o.Retry = RetryOptions{MaxRetries: -1} }},
		{"CircuitBreaker.FailureRatio", func(o *Options) { o.CircuitBreaker.FailureRatio = 2 }},
		{"RateLimit.MaxConcurrent", func(o *Options) { o.RateLimit.MaxConcurrent = -1 }},
		{"AttemptTimeout", func(o *Options) { o.AttemptTimeout, o.TotalTimeout = time.Minute, time.Second }},
		{"Name", func(o *Options) { o.Name = "another" }},
		{"PerHost.Enabled", func(o *Options) { o.PerHost.Enabled = true }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			bad := liveBreakerOptions(rec, time.Millisecond) // a valid change besides the bad one
			bad.CircuitBreaker.FailureRatio = 0.9
			tc.change(&bad)
			err := h.Update(bad)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
			assert.True(t, strings.HasPrefix(err.Error(), `resilience: handler "cb-test": `), err.Error())

			assert.Same(t, cfg, h.cfg.Load(), "the options are unchanged")
			assert.Same(t, pol, h.shared.policies.Load(), "the breaker and limits are unchanged")
			assert.Equal(t, CircuitOpen, h.CircuitState())
			liveRejected(t, tr, up)
		})
	}
	require.NoError(t, h.Update(Options{Retry: RetryOptions{Disabled: true}}), "an empty Name keeps the name")
	assert.Equal(t, "cb-test", h.Name())
}

// A new concurrency limit is for the calls admitted after the update; a call
// admitted before gives its permit back to the limit it took it from.
func TestUpdateConcurrencyLimitTakesPermitsBackWhereTheyCameFrom(t *testing.T) {
	up := cbNewUpstream(http.StatusOK)
	defer up.Close()
	defer up.unblock()
	o := Options{Name: "live", RateLimit: RateLimitOptions{MaxConcurrent: 1}}
	h, err := NewHandler(o)
	require.NoError(t, err)
	tr := h.Transport(nil)

	held := make(chan error, 1)
	go func() {
		_, err := cbCall(context.Background(), tr, up.URL, true)
		held <- err
	}()
	up.waitArrived(t)
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the one permit is held")
	old := h.shared.policies.Load().bulkhead

	o.RateLimit.MaxConcurrent = 2
	require.NoError(t, h.Update(o))
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err, "the new limit admits calls")
	assert.Equal(t, http.StatusOK, status)

	up.unblock()
	select {
	case err := <-held:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		// Its permit went back to the new limit, which had none out.
		require.FailNow(t, "the call in flight never ended")
	}
	assert.True(t, old.tryAcquire(), "the call in flight gave its permit back to the old limit")
	bh := h.shared.policies.Load().bulkhead
	require.NotSame(t, old, bh)
	assert.True(t, bh.tryAcquire())
	assert.True(t, bh.tryAcquire())
	assert.False(t, bh.tryAcquire(), "the new limit got no permit it did not give")
}

// What an update keeps besides the circuit: the retry budget's tokens (at
// most the new MaxTokens, and while the budget is disabled), isolation, and
// with PerHost every host's state.
func TestUpdateKeepsBudgetIsolationAndHosts(t *testing.T) {
	t.Run("retry budget", func(t *testing.T) {
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		o := liveRetryOptions(3, &evRecorder{})
		o.RetryBudget = RetryBudgetOptions{MaxTokens: 5}
		o.CircuitBreaker.Disabled = true
		h, err := NewHandler(o)
		require.NoError(t, err)
		tr := h.Transport(nil)
		call := func() int64 {
			hits := up.hits.Load()
			_, err := cbGet(t, tr, up.URL)
			require.NoError(t, err)
			return up.hits.Load() - hits
		}
		require.EqualValues(t, 4, call())
		require.Equal(t, 2.0, h.budget.Level(), "three failed retries spent three of five tokens")

		o.Retry.MaxRetries = 2
		o.RetryBudget.TokenRatio = 0.5
		require.NoError(t, h.Update(o))
		assert.Equal(t, 2.0, h.budget.Level(), "the tokens are kept")

		o.RetryBudget.MaxTokens = 1
		require.NoError(t, h.Update(o))
		assert.Equal(t, 1.0, h.budget.Level(), "at most the new MaxTokens")
		require.EqualValues(t, 2, call(), "one token: one retry")
		require.Zero(t, h.budget.Level())

		o.RetryBudget.Disabled = true
		require.NoError(t, h.Update(o))
		assert.EqualValues(t, 3, call(), "no budget: every retry is made")
		o.RetryBudget.Disabled = false
		require.NoError(t, h.Update(o))
		assert.EqualValues(t, 1, call(), "enabled again, the budget is as empty as it was")
	})

	t.Run("isolation", func(t *testing.T) {
		up := cbNewUpstream(http.StatusOK)
		defer up.Close()
		rec := &evRecorder{}
		h, err := NewHandler(liveBreakerOptions(rec, cbLongBreak))
		require.NoError(t, err)
		tr := h.Transport(nil)
		h.IsolateCircuit()
		o := liveBreakerOptions(rec, cbLongBreak)
		o.CircuitBreaker.FailureRatio = 0.9
		require.NoError(t, h.Update(o))
		assert.Equal(t, CircuitIsolated, h.CircuitState())
		liveRejected(t, tr, up)
		h.CloseCircuit()
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	})

	t.Run("hosts", func(t *testing.T) {
		bad := cbNewUpstream(http.StatusServiceUnavailable)
		defer bad.Close()
		good := cbNewUpstream(http.StatusOK)
		defer good.Close()
		rec := &evRecorder{}
		o := liveBreakerOptions(rec, cbLongBreak)
		o.PerHost.Enabled = true
		h, err := NewHandler(o)
		require.NoError(t, err)
		tr := h.Transport(nil)
		cbTrip(t, tr, bad, 2)
		status, err := cbGet(t, tr, good.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		hosts := h.hosts.all()
		require.Len(t, hosts, 2)

		o.CircuitBreaker.MinimumThroughput = 5
		o.RateLimit.MaxConcurrent = 10
		o.PerHost.MaxHosts = 10
		require.NoError(t, h.Update(o))
		assert.ElementsMatch(t, hosts, h.hosts.all(), "the hosts are kept")
		assert.Equal(t, map[string]CircuitState{bad.URL: CircuitOpen, good.URL: CircuitClosed}, h.HostCircuitStates())
		liveRejected(t, tr, bad)
		for _, s := range hosts {
			p := s.policies.Load()
			assert.Equal(t, 5, s.circuit.Options().MinimumThroughput, "%s has the new breaker", s.host)
			assert.Equal(t, 10, p.rl.MaxConcurrent, "%s has the new limit", s.host)
		}
		assert.Equal(t, 10, h.hosts.max)
	})
}
