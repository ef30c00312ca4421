package resilience

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptedRate is a SharedRate that gives the answers of its script in
// turn (the last one for ever) and records the keys it is asked for.
type scriptedRate struct {
	mu     sync.Mutex
	script []SharedRateResult
	err    error
	keys   []string
}

func (r *scriptedRate) Take(ctx context.Context, key string) (SharedRateResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	if r.err != nil {
		return SharedRateResult{}, r.err
	}
	res := r.script[0]
	if len(r.script) > 1 {
		r.script = r.script[1:]
	}
	return res, nil
}

func (r *scriptedRate) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// sharedFunc is a SharedRate whose dynamic type is not comparable.
type sharedFunc func(ctx context.Context, key string) (SharedRateResult, error)

func (f sharedFunc) Take(ctx context.Context, key string) (SharedRateResult, error) {
	return f(ctx, key)
}

func TestSharedRateKeyIsHandlerName(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	sr := &scriptedRate{script: []SharedRateResult{{}}}
	h, err := NewHandler(admOptions(&evRecorder{}, RateLimitOptions{Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 3; i++ {
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
	}
	assert.Equal(t, []string{"adm-test", "adm-test", "adm-test"}, sr.taken(), "one permit per call, under the handler's name")
	assert.Zero(t, admHeldPermits(h))
}

func TestSharedRateKeyPerHost(t *testing.T) {
	a, b := admNewUpstream(false), admNewUpstream(false)
	defer a.Close()
	defer b.Close()
	sr := &scriptedRate{script: []SharedRateResult{{}}}
	opts := admOptions(&evRecorder{}, RateLimitOptions{Shared: sr})
	opts.PerHost.Enabled = true
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, a.URL)
	require.NoError(t, err)
	_, err = cbGet(t, tr, b.URL)
	require.NoError(t, err)
	assert.Equal(t, []string{"adm-test " + a.URL, "adm-test " + b.URL}, sr.taken())
}

func TestSharedRateFailFastSaysWhenDue(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	sr := &scriptedRate{script: []SharedRateResult{{Wait: 750 * time.Millisecond}}}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "shared", rle.Limit)
	assert.Equal(t, 750*time.Millisecond, rle.RetryAfter)
	assert.Zero(t, up.hits.Load(), "a refused call is not sent")
	assert.Equal(t, 1, rec.count(EventRateLimited))
	assert.Len(t, sr.taken(), 1, "fail fast: asked once")
	assert.Zero(t, admHeldPermits(h), "the concurrency permit is given back")
}

func TestSharedRateWaitAsksAgain(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	sr := &scriptedRate{script: []SharedRateResult{{Wait: 5 * time.Millisecond}, {Wait: time.Millisecond}, {}}}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{Shared: sr, Wait: true}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	start := time.Now()
	status, err := cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.GreaterOrEqual(t, time.Since(start), 6*time.Millisecond, "waited as told, twice")
	assert.Len(t, sr.taken(), 3, "asked again after each wait")
	assert.Zero(t, rec.count(EventRateLimited))
	assert.EqualValues(t, 1, up.hits.Load())
}

func TestSharedRateWaitRefusedPastDeadline(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	sr := &scriptedRate{script: []SharedRateResult{{Wait: time.Hour}}}
	opts := admOptions(&evRecorder{}, RateLimitOptions{Shared: sr, Wait: true})
	opts.TotalTimeout, opts.AttemptTimeout = time.Second, time.Second
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	start := time.Now()
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.Less(t, time.Since(start), 500*time.Millisecond, "refused at once")
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, time.Hour, rle.RetryAfter)
	assert.Zero(t, up.hits.Load())
}

func TestSharedRateStoreErrorRefuses(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	broken := errors.New("store unreachable")
	sr := &scriptedRate{err: broken}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{Shared: sr, Wait: true}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	require.ErrorIs(t, err, broken)
	assert.Contains(t, err.Error(), `handler "adm-test": rate limited because the shared rate's store failed: store unreachable`)
	assert.Zero(t, up.hits.Load())
	assert.Equal(t, 1, rec.count(EventRateLimited))
	assert.Zero(t, admHeldPermits(h))
}

func TestSharedRateCallerCancelIsNotRateLimited(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	sr := sharedFunc(func(ctx context.Context, key string) (SharedRateResult, error) {
		cancel()
		return SharedRateResult{}, ctx.Err()
	})
	h, err := NewHandler(admOptions(&evRecorder{}, RateLimitOptions{Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrRateLimited, "the caller left; no rate refused it")
	assert.Zero(t, up.hits.Load())
}

func TestSharedRateFallbackEventsOncePerChange(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	down := errors.New("redis: connection refused")
	sr := &scriptedRate{script: []SharedRateResult{{}, {Fallback: down}, {Fallback: down}, {Fallback: down}, {}, {}}}
	h, err := NewHandler(admOptions(rec, RateLimitOptions{Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 6; i++ {
		_, err := cbGet(t, tr, up.URL)
		require.NoError(t, err, "a call answered by the fallback is admitted")
	}
	assert.Equal(t, []EventKind{EventSharedRateFallback, EventSharedRateRecovered}, rec.kinds())
	fb := rec.of(EventSharedRateFallback)
	require.Len(t, fb, 1)
	assert.ErrorIs(t, fb[0].Err, down, "the event says why")
	assert.EqualValues(t, 6, up.hits.Load())
}

func TestSharedRateNotAskedWhenLocalRefuses(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	sr := &scriptedRate{script: []SharedRateResult{{}}}
	h, err := NewHandler(admOptions(&evRecorder{}, RateLimitOptions{RequestsPerSecond: 0.01, Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.NoError(t, err)
	_, err = cbGet(t, tr, up.URL)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "local", rle.Limit)
	assert.Len(t, sr.taken(), 1, "a call the local rate refuses spends no shared permit")
}

func TestSharedRateOffWhenDisabled(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	sr := &scriptedRate{script: []SharedRateResult{{Wait: time.Hour}}}
	h, err := NewHandler(admOptions(&evRecorder{}, RateLimitOptions{Disabled: true, Shared: sr}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Empty(t, sr.taken())
}

func TestSharedRateUpdateWithIncomparableStore(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	var calls int
	var mu sync.Mutex
	sr := sharedFunc(func(context.Context, string) (SharedRateResult, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return SharedRateResult{}, nil
	})
	opts := admOptions(&evRecorder{}, RateLimitOptions{Shared: sr})
	h, err := NewHandler(opts)
	require.NoError(t, err)
	require.NotPanics(t, func() { require.NoError(t, h.Update(opts)) }, "== on a func-typed Shared would panic")
	opts.RateLimit.Shared = nil
	require.NoError(t, h.Update(opts))
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	_, err = cbGet(t, tr, up.URL)
	require.NoError(t, err)
	assert.Zero(t, calls, "Update took the store away")
	assert.True(t, sameRateOptions(RateLimitOptions{MaxQueue: 1}, RateLimitOptions{MaxQueue: 1}))
	assert.False(t, sameRateOptions(RateLimitOptions{Shared: sr}, RateLimitOptions{Shared: sr}), "incomparable: taken as changed")
}
