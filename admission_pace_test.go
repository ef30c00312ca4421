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

func TestPaceLocalWaitSpacesCalls(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	// 50 calls per second: the second and third calls wait about 20 ms each.
	h, err := NewHandler(admOptions(rec, RateLimitOptions{RequestsPerSecond: 50, Wait: true}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	start := time.Now()
	for i := 0; i < 3; i++ {
		status, err := cbGet(t, tr, up.URL)
		require.NoError(t, err, "call %d waits for its permit", i+1)
		assert.Equal(t, http.StatusOK, status)
	}
	assert.GreaterOrEqual(t, time.Since(start), 35*time.Millisecond, "two waits of one interval each")
	assert.EqualValues(t, 3, up.hits.Load())
	assert.Zero(t, rec.count(EventRateLimited), "a call that waits is not refused")
	assert.Zero(t, admHeldPermits(h))
}

func TestPaceLocalWaitRefusedWhenDuePastDeadline(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	rec := &evRecorder{}
	opts := admOptions(rec, RateLimitOptions{RequestsPerSecond: 0.1, Wait: true}) // one call per 10 s
	opts.TotalTimeout, opts.AttemptTimeout = time.Second, time.Second
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.NoError(t, err)
	start := time.Now()
	_, err = cbGet(t, tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	assert.Less(t, time.Since(start), 500*time.Millisecond, "refused at once, not after waiting out the deadline")
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "local", rle.Limit)
	assert.EqualValues(t, 1, up.hits.Load())
	assert.Equal(t, 1, rec.count(EventRateLimited))
	assert.Zero(t, admHeldPermits(h))
}

func TestPaceLocalWaitEndsWhenCallerLeaves(t *testing.T) {
	up := admNewUpstream(false)
	defer up.Close()
	h, err := NewHandler(admOptions(&evRecorder{}, RateLimitOptions{RequestsPerSecond: 0.1, Wait: true}))
	require.NoError(t, err) // no deadline: the second call would wait 10 s
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = cbGet(t, tr, up.URL)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = cbCall(ctx, tr, up.URL, false)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrRateLimited)
	assert.Contains(t, err.Error(), "waiting for a local rate permit")
	assert.EqualValues(t, 1, up.hits.Load())
	assert.Zero(t, admHeldPermits(h), "the waiting call gave its concurrency permit back")
}

func TestRateLimitErrorMessage(t *testing.T) {
	assert.Equal(t, "resilience: over the server rate, next permit in 1.5s",
		(&RateLimitError{Limit: "server", RetryAfter: 1500 * time.Millisecond}).Error())
	assert.Equal(t, "resilience: over the shared rate", (&RateLimitError{Limit: "shared"}).Error())
	assert.ErrorIs(t, &RateLimitError{Limit: "local"}, ErrRateLimited)

	// A server quota's refusal names it, its resource and the answer's
	// status; the upstream's bytes are quoted.
	assert.Equal(t, `resilience: over the server rate, next permit in 1m0s (quota "X-RateLimit", resource "search", status 403)`,
		(&RateLimitError{Limit: "server", RetryAfter: time.Minute, Quota: "X-RateLimit", Resource: "search",
			Response: &http.Response{StatusCode: http.StatusForbidden}}).Error())
	assert.Equal(t, `resilience: over the server rate (quota "default")`,
		(&RateLimitError{Limit: "server", Quota: "default"}).Error())
	assert.Equal(t, `resilience: over the server rate (resource "a\nb")`,
		(&RateLimitError{Limit: "server", Resource: "a\nb"}).Error())
}

func TestLoadConfigRateLimitWait(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"vendor": {"rateLimit": {"requestsPerSecond": 100, "wait": true}}}}`))
	require.NoError(t, err)
	rl := cfg.Upstreams["vendor"].RateLimit
	assert.True(t, rl.Wait)
	assert.Equal(t, 100.0, rl.RequestsPerSecond)

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"vendor": {"rateLimit": {"wait": "yes"}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rateLimit.wait")
}
