package resilience

import (
	"context"
	"errors"
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

// Breaker settings of these tests: at least 4 attempts, half of them failed,
// within 1s. cbShortBreak is long enough that "open" can be asserted right
// after opening, and short enough to wait for half-open with Eventually.
const (
	cbShortBreak = 100 * time.Millisecond
	cbLongBreak  = time.Minute
)

func cbOptions(rec *evRecorder, breakDuration time.Duration) Options {
	return Options{
		Name:           "cb-test",
		Retry:          RetryOptions{Disabled: true},
		AttemptTimeout: -1,
		CircuitBreaker: CircuitBreakerOptions{
			FailureRatio:      0.5,
			MinimumThroughput: 4,
			SamplingDuration:  time.Second,
			BreakDuration:     breakDuration,
		},
		OnEvent: rec.add,
	}
}

// cbUpstream answers with status (changeable), counts the requests that
// reach it, and holds those carrying an X-Hold header until release.
type cbUpstream struct {
	*httptest.Server
	hits    atomic.Int64
	status  atomic.Int64
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

func cbNewUpstream(status int) *cbUpstream {
	u := &cbUpstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.status.Store(int64(status))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if r.Header.Get("X-Hold") != "" {
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(int(u.status.Load()))
		_, _ = io.WriteString(w, "payload")
	}))
	return u
}

// unblock lets every held request go; safe to call more than once.
func (u *cbUpstream) unblock() { u.once.Do(func() { close(u.release) }) }

func (u *cbUpstream) waitArrived(t *testing.T) {
	t.Helper()
	select {
	case <-u.arrived:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the held request never reached the upstream")
	}
}

// cbCall sends a GET through rt and returns the status, having read and
// closed the body. It makes no assertions so that goroutines may use it.
func cbCall(ctx context.Context, rt http.RoundTripper, url string, hold bool) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if hold {
		req.Header.Set("X-Hold", "1")
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		if resp != nil {
			return 0, errors.New("RoundTrip returned both a response and an error")
		}
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

func cbGet(t *testing.T, rt http.RoundTripper, url string) (int, error) {
	t.Helper()
	return cbCall(context.Background(), rt, url, false)
}

// cbTrip sends n calls that the upstream answers with 503.
func cbTrip(t *testing.T, rt http.RoundTripper, up *cbUpstream, n int) {
	t.Helper()
	up.status.Store(http.StatusServiceUnavailable)
	for i := 0; i < n; i++ {
		status, err := cbGet(t, rt, up.URL)
		require.NoError(t, err, "call %d", i+1)
		require.Equal(t, http.StatusServiceUnavailable, status, "call %d", i+1)
	}
}

func cbWaitHalfOpen(t *testing.T, h *Handler) {
	t.Helper()
	require.Eventually(t, func() bool { return h.CircuitState() == CircuitHalfOpen },
		5*time.Second, 2*time.Millisecond, "circuit never became half-open; state %v", h.CircuitState())
}

func TestCircuitStateString(t *testing.T) {
	assert.Equal(t, "closed", CircuitClosed.String())
	assert.Equal(t, "open", CircuitOpen.String())
	assert.Equal(t, "half-open", CircuitHalfOpen.String())
	assert.Equal(t, "isolated", CircuitIsolated.String())
	assert.Equal(t, "unknown", CircuitState(42).String())
}

func TestCircuitStaysClosedBelowMinimumThroughput(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 3)
	assert.Equal(t, CircuitClosed, h.CircuitState(), "3 failures are below MinimumThroughput 4")
	assert.EqualValues(t, 3, up.hits.Load())
	assert.Zero(t, rec.count(EventCircuitOpened))

	cbTrip(t, tr, up, 1) // the 4th failure reaches the upstream and opens the circuit
	assert.EqualValues(t, 4, up.hits.Load())
	assert.Equal(t, CircuitOpen, h.CircuitState())
}

func TestCircuitOpensAtFailureRatio(t *testing.T) {
	up := cbNewUpstream(http.StatusOK)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for _, st := range []int{200, 200, 200, 503, 503} { // 2 of 5 failed: below 0.5
		up.status.Store(int64(st))
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		require.Equal(t, st, status)
	}
	assert.Equal(t, CircuitClosed, h.CircuitState())
	cbTrip(t, tr, up, 1) // 3 of 6: the ratio is met
	assert.Equal(t, CircuitOpen, h.CircuitState())
	require.Equal(t, 1, rec.count(EventCircuitOpened))
	assert.Contains(t, rec.of(EventCircuitOpened)[0].Err.Error(), "3 of 6 attempts failed")
}

func TestCircuitOpenRejectsWithReason(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4)
	require.Equal(t, CircuitOpen, h.CircuitState())
	hits := up.hits.Load()

	client := &http.Client{Transport: tr}
	resp, err := client.Get(up.URL)
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, hits, up.hits.Load(), "a rejected call never reaches the upstream")
	msg := err.Error()
	assert.Contains(t, msg, `handler "cb-test"`)
	assert.Contains(t, msg, "circuit open")
	assert.Contains(t, msg, "503")
	assert.Contains(t, msg, http.StatusText(http.StatusServiceUnavailable))
	assert.Contains(t, msg, "4 of 4 attempts failed")

	rejected := rec.of(EventCircuitRejected)
	require.Len(t, rejected, 1)
	assert.Equal(t, http.MethodGet, rejected[0].Method)
	assert.Contains(t, rejected[0].Err.Error(), "attempts failed")
}

func TestCircuitStateTransitionsAndProbeSuccessCloses(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbShortBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	assert.Equal(t, CircuitClosed, h.CircuitState())
	cbTrip(t, tr, up, 4)
	assert.Equal(t, CircuitOpen, h.CircuitState())
	cbWaitHalfOpen(t, h)

	up.status.Store(http.StatusOK)
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.EqualValues(t, 5, up.hits.Load())
	assert.Equal(t, []EventKind{EventCircuitOpened, EventCircuitHalfOpened, EventCircuitClosed}, rec.kinds())
	for _, e := range rec.all() {
		assert.Equal(t, "cb-test", e.Handler)
	}

	// Closed again: calls flow and the window starts afresh.
	cbTrip(t, tr, up, 3)
	assert.Equal(t, CircuitClosed, h.CircuitState())
}

func TestCircuitHalfOpenAdmitsOneProbe(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbShortBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4)
	cbWaitHalfOpen(t, h)
	up.status.Store(http.StatusOK)

	type result struct {
		status int
		err    error
	}
	probe := make(chan result, 1)
	go func() {
		status, err := cbCall(context.Background(), tr, up.URL, true)
		probe <- result{status, err}
	}()
	up.waitArrived(t)
	assert.Equal(t, CircuitHalfOpen, h.CircuitState(), "the probe is in flight")
	hits := up.hits.Load()

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen, "half-open admits a single probe")
	assert.Equal(t, hits, up.hits.Load(), "the second call never reached the upstream")

	up.unblock()
	r := <-probe
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.Equal(t, []EventKind{EventCircuitOpened, EventCircuitHalfOpened, EventCircuitRejected, EventCircuitClosed}, rec.kinds())

	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
}

func TestCircuitProbeFailureReopens(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbShortBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4)
	cbWaitHalfOpen(t, h)
	cbTrip(t, tr, up, 1) // the probe reaches the upstream and fails
	assert.EqualValues(t, 5, up.hits.Load())
	assert.Equal(t, CircuitOpen, h.CircuitState())
	assert.Equal(t, []EventKind{EventCircuitOpened, EventCircuitHalfOpened, EventCircuitOpened}, rec.kinds())
	reopened := rec.of(EventCircuitOpened)[1]
	require.Error(t, reopened.Err)
	assert.Contains(t, reopened.Err.Error(), "probe")

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "probe")
	assert.EqualValues(t, 5, up.hits.Load())

	// Another break, another probe; this one succeeds.
	cbWaitHalfOpen(t, h)
	up.status.Store(http.StatusOK)
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, CircuitClosed, h.CircuitState())
}

func TestCircuitAbandonedProbeKeepsCircuitOpen(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbShortBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4)
	cbWaitHalfOpen(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cbCall(ctx, tr, up.URL, true)
		done <- err
	}()
	up.waitArrived(t)
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, CircuitOpen, h.CircuitState(), "an abandoned probe must not leave the circuit half-open forever")
	assert.Equal(t, 2, rec.count(EventCircuitOpened))
}

func TestCircuitCallerCancellationNotCounted(t *testing.T) {
	up := cbNewUpstream(http.StatusOK)
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 4; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := cbCall(ctx, tr, up.URL, true)
			done <- err
		}()
		up.waitArrived(t)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.Zero(t, rec.count(EventCircuitOpened))
}

func TestCircuitAttemptTimeoutsCount(t *testing.T) {
	up := cbNewUpstream(http.StatusOK)
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	opts := cbOptions(rec, cbLongBreak)
	opts.AttemptTimeout = 20 * time.Millisecond
	opts.StrictAttemptTimeout = true // each call alone: nothing overtakes its attempt
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 4; i++ {
		_, err := cbCall(context.Background(), tr, up.URL, true) // held past the attempt timeout
		require.ErrorIs(t, err, ErrAttemptTimeout)
	}
	assert.Equal(t, CircuitOpen, h.CircuitState())
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "attempt timeout")
}

func TestCircuitIsolate(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		name := "breaker enabled"
		if disabled {
			name = "breaker disabled"
		}
		t.Run(name, func(t *testing.T) {
			up := cbNewUpstream(http.StatusOK)
			defer up.Close()
			rec := &evRecorder{}
			opts := cbOptions(rec, cbLongBreak)
			opts.CircuitBreaker.Disabled = disabled
			h, err := NewHandler(opts)
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()

			h.IsolateCircuit()
			assert.Equal(t, CircuitIsolated, h.CircuitState())
			for i := 0; i < 2; i++ {
				_, err = cbGet(t, tr, up.URL)
				require.ErrorIs(t, err, ErrCircuitOpen)
				assert.Contains(t, err.Error(), "isolated")
			}
			assert.Zero(t, up.hits.Load(), "an isolated circuit lets nothing through")
			opened := rec.of(EventCircuitOpened)
			require.Len(t, opened, 1)
			assert.Contains(t, opened[0].Err.Error(), "isolated")
			assert.Equal(t, 2, rec.count(EventCircuitRejected))

			h.CloseCircuit()
			assert.Equal(t, CircuitClosed, h.CircuitState())
			assert.Equal(t, 1, rec.count(EventCircuitClosed))
			status, err := cbGet(t, tr, up.URL)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, status)
			assert.EqualValues(t, 1, up.hits.Load())
		})
	}
}

func TestCircuitCloseCircuitAfterOpenForgetsFailures(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4)
	require.Equal(t, CircuitOpen, h.CircuitState())
	h.IsolateCircuit()
	assert.Equal(t, CircuitIsolated, h.CircuitState(), "isolation overrides the open state")
	h.CloseCircuit()
	assert.Equal(t, CircuitClosed, h.CircuitState())

	cbTrip(t, tr, up, 3) // counted afresh: 3 is below MinimumThroughput
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.EqualValues(t, 7, up.hits.Load())
}

func TestCircuitRetriesCountAsAttempts(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	opts := cbOptions(rec, cbLongBreak)
	opts.Retry = RetryOptions{MaxRetries: 3, Delay: time.Millisecond, NoJitter: true}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err, "retries ran out on a response: the caller gets it")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.EqualValues(t, 4, up.hits.Load())
	assert.Equal(t, 3, rec.count(EventRetry))
	assert.Equal(t, CircuitOpen, h.CircuitState(), "one call, four failed attempts")
	require.Equal(t, 1, rec.count(EventCircuitOpened))
	assert.Contains(t, rec.of(EventCircuitOpened)[0].Err.Error(), "4 of 4 attempts failed")

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.EqualValues(t, 4, up.hits.Load())
}

func TestCircuitClientErrorsAreNotFailures(t *testing.T) {
	up := cbNewUpstream(http.StatusNotFound)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 8; i++ {
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusNotFound, status)
	}
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.EqualValues(t, 8, up.hits.Load())
	assert.Zero(t, rec.count(EventCircuitOpened))
}

func TestCircuitShouldHandleOverride(t *testing.T) {
	t.Run("404 counts", func(t *testing.T) {
		up := cbNewUpstream(http.StatusNotFound)
		defer up.Close()
		rec := &evRecorder{}
		opts := cbOptions(rec, cbLongBreak)
		opts.CircuitBreaker.ShouldHandle = func(resp *http.Response, err error) bool {
			return err != nil || resp.StatusCode == http.StatusNotFound
		}
		h, err := NewHandler(opts)
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{})
		defer tr.CloseIdleConnections()
		for i := 0; i < 4; i++ {
			status, err := cbGet(t, tr, up.URL)
			require.NoError(t, err)
			require.Equal(t, http.StatusNotFound, status)
		}
		assert.Equal(t, CircuitOpen, h.CircuitState())
		_, err = cbGet(t, tr, up.URL)
		require.ErrorIs(t, err, ErrCircuitOpen)
		assert.Contains(t, err.Error(), "404")
		assert.EqualValues(t, 4, up.hits.Load())
	})
	t.Run("503 ignored", func(t *testing.T) {
		up := cbNewUpstream(http.StatusServiceUnavailable)
		defer up.Close()
		rec := &evRecorder{}
		opts := cbOptions(rec, cbLongBreak)
		opts.CircuitBreaker.ShouldHandle = func(*http.Response, error) bool { return false }
		h, err := NewHandler(opts)
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{})
		defer tr.CloseIdleConnections()
		cbTrip(t, tr, up, 8)
		assert.Equal(t, CircuitClosed, h.CircuitState())
	})
}

func TestCircuitSharedAcrossTransports(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbLongBreak))
	require.NoError(t, err)
	trA := h.Transport(&http.Transport{})
	defer trA.CloseIdleConnections()
	trB := h.Transport(&http.Transport{})
	defer trB.CloseIdleConnections()
	assert.Same(t, trA.Handler(), trB.Handler())
	clientA := &http.Client{Transport: trA}
	clientB := &http.Client{Transport: trB}

	cbTrip(t, clientA.Transport, up, 4)
	resp, err := clientB.Get(up.URL)
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, ErrCircuitOpen, "client B sees the circuit client A opened")
	assert.EqualValues(t, 4, up.hits.Load())
	assert.Equal(t, CircuitOpen, h.CircuitState())

	// Separate handlers do not share state.
	other, err := NewTransport(&http.Transport{}, cbOptions(&evRecorder{}, cbLongBreak))
	require.NoError(t, err)
	defer other.CloseIdleConnections()
	status, err := cbGet(t, other, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.EqualValues(t, 5, up.hits.Load())
}

// The seed's first exercise, made deterministic: a retried 503, an
// open-circuit rejection and a successful half-open probe.
func TestCircuitSeedExercise1(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable, http.StatusOK, // call 1: retried
		http.StatusServiceUnavailable, http.StatusServiceUnavailable) // call 2: opens
	defer up.Close()
	rec := &evRecorder{}
	opts := cbOptions(rec, cbShortBreak)
	opts.Retry = RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	status, err := evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "the retry hides the 503")
	require.Equal(t, 1, rec.count(EventRetry))
	assert.Equal(t, http.StatusServiceUnavailable, rec.of(EventRetry)[0].StatusCode)
	assert.Equal(t, CircuitClosed, h.CircuitState())

	status, err = evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, CircuitOpen, h.CircuitState(), "3 of 4 attempts failed")
	assert.EqualValues(t, 4, up.hits.Load())

	_, err = evGet(t, tr, up.URL, http.MethodGet)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.EqualValues(t, 4, up.hits.Load(), "rejected without reaching the upstream")

	cbWaitHalfOpen(t, h)
	status, err = evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "the half-open probe succeeds")
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.EqualValues(t, 5, up.hits.Load())
	assert.Equal(t, []EventKind{
		EventRetry, EventRetry, EventCircuitOpened, EventCircuitRejected,
		EventCircuitHalfOpened, EventCircuitClosed,
	}, rec.kinds())
}

// An open circuit's reason names the failures that tripped it, not those of
// an earlier, already closed, episode.
func TestCircuitReasonForgetsFailuresBeforeClose(t *testing.T) {
	up := cbNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(cbOptions(rec, cbShortBreak))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	cbTrip(t, tr, up, 4) // opens on 503s
	cbWaitHalfOpen(t, h)
	up.status.Store(http.StatusOK)
	status, err := cbGet(t, tr, up.URL) // the probe closes it
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, CircuitClosed, h.CircuitState())

	up.status.Store(http.StatusBadGateway)
	for i := 0; i < 4; i++ {
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadGateway, status)
	}
	require.Equal(t, CircuitOpen, h.CircuitState())
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "502")
	assert.NotContains(t, err.Error(), "503", "the 503s ended with the previous episode")
}

// A circuit opening while another attempt is in flight: the in-flight
// attempt records its outcome while the breaker's listeners run. Run with
// -race: the race detector sees the two touch the breaker's statistics
// unsynchronised whenever the handler's OnOpen listener reads them without
// the breaker's lock. The upstream answers the in-flight call only once the
// circuit is open, and the opening listener is held until that call has
// recorded, so the interleaving is the same on every run.
func TestCircuitOpensWhileAttemptInFlight(t *testing.T) {
	var h *Handler
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("X-Hold") != "" {
			deadline := time.Now().Add(5 * time.Second)
			for h.CircuitState() != CircuitOpen && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	heldDone := make(chan struct{})
	var opened atomic.Int64
	opts := cbOptions(&evRecorder{}, cbLongBreak)
	opts.OnEvent = func(e Event) {
		if e.Kind == EventCircuitOpened && opened.Add(1) == 1 {
			select { // keep the listener running until the held call recorded
			case <-heldDone:
			case <-time.After(5 * time.Second):
			}
		}
	}
	var err error
	h, err = NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 3; i++ {
		status, err := cbCall(context.Background(), tr, srv.URL, false)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	held := make(chan error, 1)
	go func() {
		defer close(heldDone)
		status, err := cbCall(context.Background(), tr, srv.URL, true)
		if err == nil && status != http.StatusOK {
			err = errors.New(http.StatusText(status))
		}
		held <- err
	}()
	require.Eventually(t, func() bool { return hits.Load() == 4 }, 5*time.Second, time.Millisecond)
	status, err := cbCall(context.Background(), tr, srv.URL, false) // the 4th failure opens
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	require.NoError(t, <-held, "the call in flight when the circuit opened completes")
	assert.Equal(t, CircuitOpen, h.CircuitState())
	assert.EqualValues(t, 1, opened.Load())
}
