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

// probeUpstream answers with status (changeable) and holds a request whose
// X-Hold header is set until the request's context ends.
type probeUpstream struct {
	*httptest.Server
	status  atomic.Int64
	arrived chan struct{}
}

func newProbeUpstream(t *testing.T) *probeUpstream {
	u := &probeUpstream{arrived: make(chan struct{}, 1)}
	u.status.Store(http.StatusOK)
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			select {
			case u.arrived <- struct{}{}:
			default:
			}
			<-r.Context().Done()
			return
		}
		w.WriteHeader(int(u.status.Load()))
	}))
	t.Cleanup(u.Close)
	return u
}

// probeHandler builds a handler from opts over a fresh transport, and
// opens its circuit with four 503s from up (cbOptions opens it at half of
// four attempts).
func probeHandler(t *testing.T, up *probeUpstream, opts Options) (*Handler, *Transport) {
	t.Helper()
	h, err := NewHandler(opts)
	require.NoError(t, err)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := h.Transport(base)
	up.status.Store(http.StatusServiceUnavailable)
	for i := 0; i < 4; i++ {
		_, _ = cbGet(t, tr, up.URL)
	}
	require.NotEqual(t, CircuitClosed, h.CircuitState())
	return h, tr
}

// Under load: rounds of trip, a herd of callers racing for the
// half-open permit and all giving up, then recovery; every round recovers,
// for the sequential and the hedged paths alike.
func TestProbeAbandonedUnderConcurrencyNeverWedges(t *testing.T) {
	for _, hedged := range []bool{false, true} {
		name := "sequential"
		if hedged {
			name = "hedged"
		}
		t.Run(name, func(t *testing.T) {
			up := newProbeUpstream(t)
			opts := Options{
				Retry:          RetryOptions{Disabled: true},
				AttemptTimeout: -1,
				RetryBudget:    RetryBudgetOptions{Disabled: true},
				CircuitBreaker: CircuitBreakerOptions{
					FailureRatio: 0.5, MinimumThroughput: 4, SamplingDuration: time.Second,
					BreakDuration: 2 * time.Millisecond,
				},
				Hedging: HedgingOptions{Enabled: hedged, Delay: time.Hour},
			}
			h, err := NewHandler(opts)
			require.NoError(t, err)
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tr := h.Transport(base)

			for round := 1; round <= 15; round++ {
				up.status.Store(http.StatusServiceUnavailable)
				for h.CircuitState() == CircuitClosed {
					_, _ = cbGet(t, tr, up.URL)
				}
				require.Eventually(t, func() bool { return h.CircuitState() == CircuitHalfOpen },
					5*time.Second, time.Millisecond, "round %d", round)

				// 32 callers race for the half-open permit; each gives up
				// after 5ms, so the one that gets it abandons it.
				var wg sync.WaitGroup
				for i := 0; i < 32; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
						defer cancel()
						_, _ = cbCall(ctx, tr, up.URL, true)
					}()
				}
				wg.Wait()

				up.status.Store(http.StatusOK)
				require.Eventually(t, func() bool {
					status, err := cbGet(t, tr, up.URL)
					return err == nil && status == http.StatusOK
				}, 5*time.Second, time.Millisecond, "round %d: the circuit never let a probe through again; state %v", round, h.CircuitState())
				require.Equal(t, CircuitClosed, h.CircuitState(), "round %d", round)
			}
		})
	}
}

// Issue 8, item 4: a hung probe does not block every call until its own
// timeout. Once it has run a whole BreakDuration another probe goes, as
// Polly does; before that, the rejection says a probe is in flight.
func TestProbeHungProbeGetsSuccessorAfterBreakDuration(t *testing.T) {
	const breakDuration = 50 * time.Millisecond
	up := newProbeUpstream(t)
	rec := &evRecorder{}
	opts := cbOptions(rec, breakDuration)
	h, tr := probeHandler(t, up, opts)
	require.Equal(t, CircuitOpen, h.CircuitState())
	cbWaitHalfOpen(t, h)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	probeStarted := time.Now()
	hung := make(chan error, 1)
	go func() {
		_, err := cbCall(ctx, tr, up.URL, true)
		hung <- err
	}()
	<-up.arrived

	up.status.Store(http.StatusOK)
	_, err := cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Contains(t, err.Error(), "probe in flight")
	assert.Contains(t, err.Error(), "of 4 attempts failed", "the rejection still says why the circuit opened")

	time.Sleep(breakDuration - time.Since(probeStarted) + 5*time.Millisecond)
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err, "a second probe must go once the first has run a whole BreakDuration")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.Equal(t, 1, rec.count(EventCircuitOpened), "letting another probe through is not a new opening")
	assert.Equal(t, 1, rec.count(EventCircuitHalfOpened))

	cancel()
	require.ErrorIs(t, <-hung, context.Canceled)
	assert.Equal(t, CircuitClosed, h.CircuitState(), "the superseded probe giving up changes nothing")
}

// A probe that fails because of the request itself (its body's reader)
// says nothing about the upstream: its permit goes back and the next call
// is the probe at once, instead of a failure reopening the circuit.
func TestProbeRequestFaultReleasesPermit(t *testing.T) {
	up := newProbeUpstream(t)
	rec := &evRecorder{}
	opts := cbOptions(rec, cbShortBreak)
	opts.Retry = RetryOptions{Methods: []string{http.MethodPut}, Delay: time.Millisecond, NoJitter: true}
	h, tr := probeHandler(t, up, opts)
	cbWaitHalfOpen(t, h)

	readErr := errors.New("disk read failed")
	req, err := http.NewRequest(http.MethodPut, up.URL, io.NopCloser(&failingReader{data: "abc", err: readErr}))
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, readErr)
	assert.NotErrorIs(t, err, ErrCircuitOpen)
	assert.Equal(t, CircuitHalfOpen, h.CircuitState(), "the permit went back")

	up.status.Store(http.StatusOK)
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.Equal(t, 1, rec.count(EventCircuitOpened))
}

// failingReader gives data, then fails with err.
type failingReader struct {
	data string
	err  error
	done bool
}

func (r *failingReader) Read(p []byte) (int, error) {
	if !r.done {
		r.done = true
		return copy(p, r.data), nil
	}
	return 0, r.err
}
