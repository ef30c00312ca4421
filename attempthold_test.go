package resilience

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 47: an attempt past its timeout is held only on evidence that it
// is queued (deadlines.holds). With none, it is cut and retried as Polly
// cuts it. These tests are the cases the issue measured from outside, each
// small: the evidence, or its absence, is the point of each.

// hangServer answers "ok" except to the requests hang says hang: those
// wait until their caller leaves or the test ends.
func hangServer(t *testing.T, hang func(n int64, r *http.Request) bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	stop := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if hang(n, r) {
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(func() {
		close(stop)
		srv.Close()
	})
	return srv, &hits
}

func holdTransport(t *testing.T, opts Options) (*Transport, *evRecorder) {
	t.Helper()
	rec := &evRecorder{}
	opts.OnEvent = rec.add
	tr, err := NewTransport(&http.Transport{}, opts)
	require.NoError(t, err)
	t.Cleanup(tr.CloseIdleConnections)
	return tr, rec
}

// closed closes the body of resp, if any, and returns err: for a call
// whose answer the test does not read.
func closed(resp *http.Response, err error) error {
	if resp != nil {
		resp.Body.Close()
	}
	return err
}

func getOK(t *testing.T, client *http.Client, url string) {
	t.Helper()
	resp, err := client.Get(url)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok", string(body))
}

// A lone GET whose first attempt hangs, on a handler that never had an
// answer, is cut at its limit and retried (issue 47, item 1): before, it
// waited to the total timeout, one attempt.
func TestAttemptLoneHungIsCutAndRetried(t *testing.T) {
	srv, hits := hangServer(t, func(n int64, _ *http.Request) bool { return n == 1 })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond},
	})
	getOK(t, &http.Client{Transport: tr}, srv.URL)
	assert.Equal(t, int64(2), hits.Load())
	assert.Equal(t, 1, rec.count(EventAttemptTimeout))
	assert.Zero(t, rec.count(EventAttemptHeld))
}

// A POST, which is not retried, whose only attempt hangs ends on the
// attempt timeout, reported as such, not on the total one (item 1).
func TestAttemptLoneHungPOSTEndsOnAttemptTimeout(t *testing.T) {
	srv, hits := hangServer(t, func(int64, *http.Request) bool { return true })
	tr, _ := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
	})
	err := closed((&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x")))
	require.ErrorIs(t, err, ErrAttemptTimeout)
	assert.NotErrorIs(t, err, ErrTotalTimeout)
	assert.Equal(t, int64(1), hits.Load())
}

// A lone attempt at an upstream that has answered, which nothing
// overtakes, is held: a sequential caller's hung request looks the same as
// a fleet replica's attempt queued in a stall, and a fleet whose replicas
// cut such attempts collapsed where bare clients did not (deadlines.holds).
// It is held to the total timeout, as a bare client's would wait.
func TestAttemptAloneAtAnUpstreamThatAnswersIsHeld(t *testing.T) {
	srv, hits := hangServer(t, func(n int64, _ *http.Request) bool { return n == 4 })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   200 * time.Millisecond,
		Retry:          RetryOptions{Delay: time.Millisecond},
	})
	client := &http.Client{Transport: tr}
	for range 3 {
		getOK(t, client, srv.URL)
	}
	err := closed(client.Get(srv.URL))
	require.ErrorIs(t, err, ErrTotalTimeout)
	assert.Equal(t, int64(4), hits.Load())
	assert.Zero(t, rec.count(EventAttemptTimeout))
	held := rec.of(EventAttemptHeld)
	require.Len(t, held, 1)
	assert.Equal(t, 1, held[0].Attempt)
	getOK(t, client, srv.URL) // on a new connection
}

// An upstream that is slow but works, every answer past the attempt
// timeout, is served, where a strict attempt timeout serves nothing: the
// first call's cuts did not help, so its last attempt is held (the
// upstream has never answered: the others are cut, as a black hole's
// must be); its late answer is the evidence that holds the next call's
// first attempt.
func TestAttemptSlowButWorkingIsServed(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-time.After(40 * time.Millisecond): // two attempt timeouts
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond},
	})
	client := &http.Client{Transport: tr}
	getOK(t, client, srv.URL)
	assert.Equal(t, int64(4), hits.Load(), "three attempts cut, the last held")
	assert.Equal(t, 3, rec.count(EventAttemptTimeout))
	held := rec.of(EventAttemptHeld)
	require.Len(t, held, 1)
	assert.Equal(t, 4, held[0].Attempt)

	getOK(t, client, srv.URL)
	assert.Equal(t, int64(5), hits.Load(), "held at once: the last answer came late")
	assert.Equal(t, 3, rec.count(EventAttemptTimeout))
	held = rec.of(EventAttemptHeld)
	require.Len(t, held, 2)
	assert.Equal(t, 1, held[1].Attempt)
}

// With TotalTimeout off, a held attempt still has a bound: holdBound
// attempt limits (item 4). Before, only the caller's context ended it.
func TestAttemptHeldHasABoundWithoutTotalTimeout(t *testing.T) {
	srv, hits := hangServer(t, func(int64, *http.Request) bool { return true })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   -1,
		Retry:          RetryOptions{Delay: time.Millisecond, MaxRetries: 1},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	err = closed((&http.Client{Transport: tr}).Do(req))
	require.ErrorIs(t, err, ErrAttemptTimeout)
	require.NoError(t, ctx.Err(), "ended by the bound, not by the caller")
	assert.Equal(t, int64(2), hits.Load())
	held := rec.of(EventAttemptHeld)
	require.Len(t, held, 1, "the retry followed a cut that did not help: held, to its bound")
	assert.Equal(t, 2, held[0].Attempt)
	assert.Equal(t, 2, rec.count(EventAttemptTimeout))
}

// A black hole from the start, met by many calls at once: no attempt has
// ever been answered, so none is held on the others' company, each first
// attempt is cut, and the circuit learns of it and opens (item 3).
func TestAttemptBlackHoleFromTheStartOpensTheCircuit(t *testing.T) {
	srv, _ := hangServer(t, func(int64, *http.Request) bool { return true })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{MinimumThroughput: 10, SamplingDuration: time.Minute},
	})
	client := &http.Client{Transport: tr}
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			err := closed(client.Get(srv.URL))
			errs <- err
		}()
	}
	for range 10 {
		require.ErrorIs(t, <-errs, ErrAttemptTimeout)
	}
	assert.Zero(t, rec.count(EventAttemptHeld))
	assert.Equal(t, 10, rec.count(EventAttemptTimeout))
	err := closed(client.Get(srv.URL))
	require.ErrorIs(t, err, ErrCircuitOpen)
}

// Hedges are cut at their limit too, when nothing says they are queued,
// and each cut sends the next hedge at once (item 5).
func TestAttemptHedgesCutAtTheirLimit(t *testing.T) {
	srv, hits := hangServer(t, func(int64, *http.Request) bool { return true })
	tr, _ := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Hedging:        HedgingOptions{Enabled: true, Delay: 5 * time.Second, MaxHedges: 2},
	})
	err := closed((&http.Client{Transport: tr}).Get(srv.URL))
	require.ErrorIs(t, err, ErrAttemptTimeout)
	assert.NotErrorIs(t, err, ErrTotalTimeout)
	assert.Equal(t, int64(3), hits.Load())
}

// With Endpoints, an endpoint that accepts and never answers is passed
// for the next: its attempt is cut, not held (item 2).
func TestAttemptHungEndpointFailsOver(t *testing.T) {
	hung, _ := hangServer(t, func(int64, *http.Request) bool { return true })
	healthy, hits := hangServer(t, func(int64, *http.Request) bool { return false })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond},
		Endpoints:      []Endpoint{{URL: hung.URL}, {URL: healthy.URL}},
	})
	client := &http.Client{Transport: tr}
	for range 3 {
		getOK(t, client, "http://upstream.invalid/")
	}
	assert.Equal(t, int64(3), hits.Load())
	assert.Equal(t, 3, rec.count(EventAttemptTimeout))
	assert.Zero(t, rec.count(EventAttemptHeld))
}

// A held attempt that its caller gives up on counts for the circuit as
// one held to the total timeout does: a failure of the upstream's, not a
// call dropped. Before, it counted for nothing.
func TestAttemptHeldThenAbandonedCountsAsTimeout(t *testing.T) {
	srv, _ := hangServer(t, func(_ int64, r *http.Request) bool { return r.URL.Path != "/warm" })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{MinimumThroughput: 2, FailureRatio: 0.5, SamplingDuration: time.Minute},
	})
	holds := make(chan struct{}, 2)
	tr.h.onHold = func() { holds <- struct{}{} }
	client := &http.Client{Transport: tr}
	getOK(t, client, srv.URL+"/warm")
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for range 2 { // two wait together at an upstream that answered: held
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			err := closed(client.Do(req))
			errs <- err
		}()
	}
	<-holds
	<-holds
	cancel()
	for range 2 {
		require.ErrorIs(t, <-errs, context.Canceled)
	}
	assert.Equal(t, 1, rec.count(EventCircuitOpened), "the two held attempts count as failures")
}

// The attempt-timeout cases of the peers' own suites (Polly's timeout and
// standard pipeline tests, dotnet/extensions' standard handler tests,
// failsafe-go's timeout tests), ported to the defaults with their times
// scaled. Each runs on a new handler, as theirs do.

// Polly: every attempt of a retried call times out; the outcome is the
// last attempt's timeout, reported as a timeout (net.Error, Timeout()
// true, context.DeadlineExceeded), each attempt cut at its own limit.
func TestPortedEveryAttemptTimesOutLastWins(t *testing.T) {
	srv, hits := hangServer(t, func(int64, *http.Request) bool { return true })
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   10 * time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond, MaxRetries: 2},
	})
	err := closed((&http.Client{Transport: tr}).Get(srv.URL))
	require.ErrorIs(t, err, ErrAttemptTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ne interface{ Timeout() bool }
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.NotErrorIs(t, err, ErrTotalTimeout)
	assert.Equal(t, int64(3), hits.Load())
	assert.Equal(t, 3, rec.count(EventAttemptTimeout), "the first two cut at their limit; the last, after cuts that did not help, at its bound")
	held := rec.of(EventAttemptHeld)
	require.Len(t, held, 1)
	assert.Equal(t, 3, held[0].Attempt)
}

// dotnet/extensions: the standard handler's attempt timeout fires before
// its total timeout, and the retry that follows is answered.
func TestPortedStandardPipelineAttemptTimeoutThenSuccess(t *testing.T) {
	srv, hits := hangServer(t, func(n int64, _ *http.Request) bool { return n == 1 })
	tr, _ := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond},
	})
	start := time.Now()
	getOK(t, &http.Client{Transport: tr}, srv.URL)
	assert.Less(t, time.Since(start), time.Second, "answered by the retry, not at the total timeout")
	assert.Equal(t, int64(2), hits.Load())
}

// Polly's circuit breaker: a half-open probe that hangs is cut at the
// attempt timeout and counts as a failure: the circuit opens again, and no
// late answer closes it.
func TestPortedHalfOpenProbeThatHangsIsCut(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	srv, _ := hangServer(t, func(n int64, _ *http.Request) bool { return !failing.Load() && n > 0 })
	srv.Config.Handler = func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if failing.Load() {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			next.ServeHTTP(w, r)
		})
	}(srv.Config.Handler)
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: 20 * time.Millisecond,
		TotalTimeout:   5 * time.Second,
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{MinimumThroughput: 2, FailureRatio: 0.5, SamplingDuration: time.Minute, BreakDuration: 20 * time.Millisecond},
	})
	client := &http.Client{Transport: tr}
	for range 2 {
		resp, err := client.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
	}
	require.Equal(t, 1, rec.count(EventCircuitOpened))
	failing.Store(false) // from now on every request hangs
	require.Eventually(t, func() bool {
		err := closed(client.Get(srv.URL))
		return errors.Is(err, ErrAttemptTimeout) // the probe went, and was cut
	}, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return rec.count(EventCircuitOpened) == 2 }, 5*time.Second, time.Millisecond,
		"the hung probe counts as a failure")
	assert.Zero(t, rec.count(EventCircuitClosed))
}

// failsafe-go: a caller that cancels while an attempt waits gets its own
// cancellation, not a timeout, even with an attempt timeout set.
func TestPortedCallerCancelWithATimeout(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv, _ := hangServer(t, func(int64, *http.Request) bool {
		arrived <- struct{}{}
		return true
	})
	tr, rec := holdTransport(t, Options{
		AttemptTimeout: time.Minute,
		TotalTimeout:   10 * time.Minute,
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	err = closed((&http.Client{Transport: tr}).Do(req))
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrAttemptTimeout)
	assert.NotErrorIs(t, err, ErrTotalTimeout)
	assert.Zero(t, rec.count(EventAttemptTimeout))
}
