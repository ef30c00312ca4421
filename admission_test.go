package resilience

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// admUpstream holds every request until it is given a token on release (or
// release is closed), announcing each arrival on arrived.
type admUpstream struct {
	*httptest.Server
	hits     atomic.Int64
	arrived  chan struct{}
	release  chan struct{}
	once     sync.Once
	holdAll  bool
	inFlight atomic.Int64
	maxSeen  atomic.Int64
}

func admNewUpstream(hold bool) *admUpstream {
	u := &admUpstream{arrived: make(chan struct{}, 128), release: make(chan struct{}), holdAll: hold}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		n := u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		for {
			m := u.maxSeen.Load()
			if n <= m || u.maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		if u.holdAll {
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	return u
}

func (u *admUpstream) releaseOne() { u.release <- struct{}{} }

func (u *admUpstream) releaseAll() { u.once.Do(func() { close(u.release) }) }

func (u *admUpstream) waitArrived(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-u.arrived:
		case <-time.After(5 * time.Second):
			require.FailNow(t, "requests never reached the upstream", "%d of %d arrived", i, n)
		}
	}
}

func admOptions(rec *evRecorder, rl RateLimitOptions) Options {
	return Options{
		Name:           "adm-test",
		RateLimit:      rl,
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent:        rec.add,
	}
}

type admResult struct {
	status int
	err    error
}

// admGo sends a GET in the background; the body is read and closed.
func admGo(tr http.RoundTripper, url string) <-chan admResult {
	ch := make(chan admResult, 1)
	go func() {
		status, err := cbCall(context.Background(), tr, url, false)
		ch <- admResult{status, err}
	}()
	return ch
}

func admWait(t *testing.T, ch <-chan admResult) admResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		require.FailNow(t, "call never returned")
	}
	return admResult{}
}

func TestAdmissionConcurrencyLimitRejects(t *testing.T) {
	up := admNewUpstream(true)
	defer up.Close()
	defer up.releaseAll()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{MaxConcurrent: 2}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	first, second := admGo(tr, up.URL), admGo(tr, up.URL)
	up.waitArrived(t, 2)

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.NotErrorIs(t, err, ErrTotalTimeout)
	assert.Contains(t, err.Error(), `handler "adm-test"`)
	assert.EqualValues(t, 2, up.hits.Load(), "the rejected call never reached the upstream")
	limited := rec.of(EventRateLimited)
	require.Len(t, limited, 1)
	assert.Equal(t, "adm-test", limited[0].Handler)
	assert.Equal(t, http.MethodGet, limited[0].Method)

	up.releaseAll()
	for _, ch := range []<-chan admResult{first, second} {
		r := admWait(t, ch)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusOK, r.status)
	}
	for i := 0; i < 3; i++ { // permits are back: calls flow again
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	}
	assert.Equal(t, 1, rec.count(EventRateLimited))
	assert.Zero(t, admHeldPermits(h))
}

func TestAdmissionQueueWaitsForPermit(t *testing.T) {
	up := admNewUpstream(true)
	defer up.Close()
	defer up.releaseAll()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{MaxConcurrent: 2, MaxQueue: 1}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	first, second := admGo(tr, up.URL), admGo(tr, up.URL)
	up.waitArrived(t, 2)
	third := admGo(tr, up.URL)
	require.Eventually(t, func() bool { return h.shared.queued.Load() == 1 }, 5*time.Second, time.Millisecond,
		"the third call waits in the queue")

	_, err = cbGet(t, tr, up.URL) // the queue is full
	require.ErrorIs(t, err, ErrRateLimited)
	assert.Equal(t, 1, rec.count(EventRateLimited))
	assert.EqualValues(t, 2, up.hits.Load())

	up.releaseOne() // one of the first two finishes and frees its permit
	up.waitArrived(t, 1)
	assert.EqualValues(t, 3, up.hits.Load(), "the queued call got the permit")
	up.releaseAll()
	for _, ch := range []<-chan admResult{first, second, third} {
		r := admWait(t, ch)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusOK, r.status)
	}
	assert.Equal(t, 1, rec.count(EventRateLimited))
}

func TestAdmissionQueueBoundedByTotalTimeout(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	opts := admOptions(rec, RateLimitOptions{MaxConcurrent: 1, MaxQueue: 1})
	opts.TotalTimeout = 50 * time.Millisecond
	opts.AttemptTimeout = -1
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	// The first call's body stays open, and its own total timeout is
	// longer, so its permit is not given back while the second waits.
	req, err := http.NewRequestWithContext(WithTotalTimeout(context.Background(), 10*time.Second), http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	held, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer held.Body.Close()

	start := time.Now()
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.ErrorIs(t, err, ErrTotalTimeout, "the queue wait ran out of the total timeout")
	assert.Equal(t, `resilience: handler "adm-test": rate limited after waiting for admission: total timeout`, err.Error(),
		"it read \"rate limited queued for admission until the total timeout: total timeout\"")
	assert.GreaterOrEqual(t, time.Since(start), 40*time.Millisecond, "it waited in the queue first")
	assert.EqualValues(t, 1, up.hits.Load())
	limited := rec.of(EventRateLimited)
	require.Len(t, limited, 1)
	assert.ErrorIs(t, limited[0].Err, ErrTotalTimeout)
}

// A refusal by admission control reads as English and names the limits
// to tune, for one call as for many: it read "rate limited 1 calls in
// flight and 0 queued".
func TestAdmissionRefusalReads(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	const tune = ", the most RateLimit.MaxConcurrent and MaxQueue allow"
	for _, tc := range []struct {
		limits RateLimitOptions
		want   string
	}{
		{RateLimitOptions{MaxConcurrent: 1}, `resilience: handler "adm-test": rate limited with 1 call in flight and none queued` + tune},
		{RateLimitOptions{MaxConcurrent: 2}, `resilience: handler "adm-test": rate limited with 2 calls in flight and none queued` + tune},
		{RateLimitOptions{MaxConcurrent: 1, MaxQueue: 1}, `resilience: handler "adm-test": rate limited with 1 call in flight and 1 queued` + tune},
		{RateLimitOptions{MaxConcurrent: 1, MaxQueue: 2}, `resilience: handler "adm-test": rate limited with 1 call in flight and 2 queued` + tune},
	} {
		h, err := NewHandler(admOptions(&evRecorder{}, tc.limits))
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{})
		var held []*http.Response
		for range tc.limits.MaxConcurrent { // bodies left open hold their permits
			resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL, nil))
			require.NoError(t, err)
			held = append(held, resp)
		}
		queued := make(chan error, tc.limits.MaxQueue)
		for range tc.limits.MaxQueue {
			go func() {
				resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL, nil))
				if err == nil {
					resp.Body.Close()
				}
				queued <- err
			}()
		}
		require.Eventually(t, func() bool { return h.shared.queued.Load() == int64(tc.limits.MaxQueue) }, 5*time.Second, time.Millisecond)
		_, err = tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL, nil))
		require.ErrorIs(t, err, ErrRateLimited)
		assert.Equal(t, tc.want, err.Error())
		for _, resp := range held {
			resp.Body.Close()
		}
		for range tc.limits.MaxQueue {
			require.NoError(t, <-queued, "a queued call got its permit once the bodies were closed")
		}
		tr.CloseIdleConnections()
	}
}

func TestAdmissionRequestsPerSecond(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{RequestsPerSecond: 1}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "local", rle.Limit)
	assert.Positive(t, rle.RetryAfter, "the next permit is due within the interval")
	assert.LessOrEqual(t, rle.RetryAfter, time.Second)
	assert.Contains(t, err.Error(), "over the local rate, next permit in")
	assert.EqualValues(t, 1, up.hits.Load())
	assert.Equal(t, 1, rec.count(EventRateLimited))

	// A rate rejection gives back the concurrency permit it took.
	assert.Zero(t, admHeldPermits(h), "no permit leaked")
}

// admHeldPermits reports how many of h's concurrency permits are in use,
// by taking all the free ones and giving them back.
func admHeldPermits(h *Handler) int {
	free := 0
	for h.shared.policies.Load().bulkhead.tryAcquire() {
		free++
	}
	for i := 0; i < free; i++ {
		h.shared.policies.Load().bulkhead.release()
	}
	return h.cfg.Load().RateLimit.MaxConcurrent - free
}

func TestAdmissionBurst(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{RequestsPerSecond: 0.5, Burst: 3}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 3; i++ {
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err, "call %d is within the burst", i+1)
		assert.Equal(t, http.StatusOK, status)
	}
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.EqualValues(t, 3, up.hits.Load())
}

func TestAdmissionDisabled(t *testing.T) {
	const n = 20
	up := admNewUpstream(true)
	defer up.Close()
	defer up.releaseAll()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{Disabled: true, MaxConcurrent: 1}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	var calls []<-chan admResult
	for i := 0; i < n; i++ {
		calls = append(calls, admGo(tr, up.URL))
	}
	up.waitArrived(t, n)
	assert.EqualValues(t, n, up.maxSeen.Load(), "all calls in flight at once")
	up.releaseAll()
	for _, ch := range calls {
		r := admWait(t, ch)
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusOK, r.status)
	}
	assert.Zero(t, rec.count(EventRateLimited))
}

func TestAdmissionPermitHeldUntilBodyDone(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{MaxConcurrent: 1}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	t.Run("until Close", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		defer resp.Body.Close()

		_, err = cbGet(t, tr, up.URL)
		require.ErrorIs(t, err, ErrRateLimited, "the open body still holds the only permit")

		require.NoError(t, resp.Body.Close())
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	})
	t.Run("until EOF", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		defer resp.Body.Close()

		_, err = cbGet(t, tr, up.URL)
		require.ErrorIs(t, err, ErrRateLimited)

		body, err := io.ReadAll(resp.Body) // EOF ends the call, without Close
		require.NoError(t, err)
		assert.Equal(t, "ok", string(body))
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	})
	t.Run("double Close releases once", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		resp.Body.Close()
		// One permit, so two calls in flight must still be impossible.
		req2, err := http.NewRequest(http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		resp2, err := tr.RoundTrip(req2)
		require.NoError(t, err)
		defer resp2.Body.Close()
		_, err = cbGet(t, tr, up.URL)
		require.ErrorIs(t, err, ErrRateLimited)
	})
	assert.EqualValues(t, 3, rec.count(EventRateLimited))
	assert.Zero(t, admHeldPermits(h), "every closed body gave its permit back")
}

// Issue 18, item 5: a body the caller never reads nor closes gives its
// concurrency permit back when the total timeout ends the call, as
// http.Client releases what a call holds when its Timeout fires: five such
// calls no longer lock every later call out for the life of the process.
func TestAdmissionPermitReleasedWhenTotalTimeoutEndsAnUnreadBody(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		_, _ = io.WriteString(w, strings.Repeat("x", 64<<10))
	})
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		TotalTimeout:   200 * time.Millisecond,
		AttemptTimeout: 100 * time.Millisecond,
		RateLimit:      RateLimitOptions{MaxConcurrent: 5},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	var left []*http.Response
	defer func() {
		for _, resp := range left {
			resp.Body.Close()
		}
	}()
	for i := 0; i < 5; i++ {
		resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
		require.NoError(t, err)
		left = append(left, resp) // neither read nor closed
	}
	_, err = tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
	require.ErrorIs(t, err, ErrRateLimited, "five calls in flight")

	require.Eventually(t, func() bool { return rec.count(EventTotalTimeout) == 5 }, 5*time.Second, 10*time.Millisecond,
		"each call's total timeout ends it and says so")
	resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
	require.NoError(t, err, "the permits came back when the total timeouts fired")
	assert.Len(t, readBody(t, resp), 64<<10)

	// The bodies left alone now fail with the total timeout, and closing
	// them gives nothing back twice.
	_, err = io.ReadAll(left[0].Body)
	require.ErrorIs(t, err, ErrTotalTimeout)
	assert.Equal(t, 5, rec.count(EventTotalTimeout), "reported once per call")
}
