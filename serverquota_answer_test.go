package resilience

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Item 3: a refusal names the quota and its resource, and errors.As
// reaches the upstream's answer it rests on, status and headers, as a
// client library such as go-github reads them to build its own
// rate-limit error.
func TestServerQuotaRefusalCarriesTheAnswer(t *testing.T) {
	up := ghNewUpstream()
	defer up.Close()
	opts := sqOptions(&evRecorder{}, RateLimitOptions{})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	status, err := ghGet(t, tr, up.URL+"/search/issues?q=a", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status)

	req, err := http.NewRequest(http.MethodGet, up.URL+"/search/issues?q=b", nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, ErrRateLimited)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "server", rle.Limit)
	assert.Equal(t, "X-RateLimit", rle.Quota)
	assert.Equal(t, "search", rle.Resource)
	assert.Greater(t, rle.RetryAfter, 50*time.Second)
	assert.LessOrEqual(t, rle.RetryAfter, time.Minute+time.Second)
	assert.Contains(t, err.Error(), `over the server rate, next permit in`)
	assert.Contains(t, err.Error(), `quota "X-RateLimit", resource "search", status 403`)

	resp := rle.Response
	require.NotNil(t, resp, "errors.As reaches the answer")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, "403 Forbidden", resp.Status)
	assert.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "search", resp.Header.Get("X-RateLimit-Resource"))
	assert.Equal(t, strconv.FormatInt(up.reset.Unix(), 10), resp.Header.Get("X-RateLimit-Reset"))
	assert.Same(t, req, resp.Request, "the request refused")
	require.NotNil(t, resp.Body)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Empty(t, body, "the answer's body is not kept")
	assert.Zero(t, resp.ContentLength)

	// What go-github's CheckResponse asks of it for a *RateLimitError.
	assert.True(t, (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusTooManyRequests) &&
		resp.Header.Get("X-RateLimit-Remaining") == "0")

	// Each refusal has its own copy: changing one changes no other.
	resp.Header.Set("X-RateLimit-Remaining", "changed")
	_, err = tr.RoundTrip(req)
	var again *RateLimitError
	require.ErrorAs(t, err, &again)
	require.NotNil(t, again.Response)
	assert.Equal(t, "0", again.Response.Header.Get("X-RateLimit-Remaining"))
}

// Item 3, for a quota of every call: the refusal names it (the draft's
// policy) and carries the answer that announced it.
func TestServerQuotaUnscopedRefusalCarriesTheAnswer(t *testing.T) {
	up := sqNewUpstream(2, 5*time.Second, "draft")
	defer up.Close()
	opts := sqOptions(&evRecorder{}, RateLimitOptions{})
	_, tr := sqTransport(t, opts)
	for i := 0; i < 2; i++ {
		_, err := sqGet(context.Background(), tr, up.URL)
		require.NoError(t, err)
	}
	_, err := sqGet(context.Background(), tr, up.URL)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "default", rle.Quota, "the draft's policy")
	assert.Empty(t, rle.Resource)
	assert.Contains(t, err.Error(), `(quota "default", status 200)`)
	require.NotNil(t, rle.Response)
	assert.Equal(t, http.StatusOK, rle.Response.StatusCode)
	assert.Equal(t, `"default";r=0;t=`, rle.Response.Header.Get("RateLimit")[:len(`"default";r=0;t=`)], "the answer that said none was left")
	require.NotNil(t, rle.Response.Request)
	assert.Equal(t, up.URL, "http://"+rle.Response.Request.URL.Host)
}

// Item 3: what is kept of the answer is bounded, keeps the quota's fields
// first, and never a Set-Cookie.
func TestServerQuotaKeptAnswerIsBounded(t *testing.T) {
	h := http.Header{
		"Set-Cookie":            {"session=secret"},
		"X-Ratelimit-Remaining": {"0"},
		"X-Ratelimit-Reset":     {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
		"X-Ratelimit-Resource":  {"search"},
	}
	for i := 0; i < 200; i++ {
		h.Set(fmt.Sprintf("X-Padding-%03d", i), strings.Repeat("x", 100))
	}
	up := sqNewStatusUpstream(h, http.StatusForbidden)
	defer up.Close()
	opts := sqOptions(&evRecorder{}, RateLimitOptions{})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	_, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	_, err = sqGet(context.Background(), tr, up.URL)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	require.NotNil(t, rle.Response)
	kept := rle.Response.Header
	size := 0
	for k, vs := range kept {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	assert.LessOrEqual(t, size, maxKeptHeaderBytes)
	assert.Less(t, len(kept), len(h))
	assert.Equal(t, "0", kept.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "search", kept.Get("X-RateLimit-Resource"))
	assert.NotEmpty(t, kept.Get("X-RateLimit-Reset"))
	assert.Empty(t, kept.Values("Set-Cookie"))
}

// The answer a refusal of a quota of every call rests on is of the current
// window: the first answer of each window, or a later one that said none
// was left; never one that says nothing new.
func TestServerQuotaKeepsTheWindowsAnswer(t *testing.T) {
	var q serverQuota
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	answer := func(rateLimit string, sent, now time.Time) {
		resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{
			"Ratelimit":        {rateLimit},
			"Ratelimit-Policy": {`"w";q=3;w=1`},
		}}
		q.sending.Add(1)
		q.observe(nil, resp, resp.Header, sent, now, time.Minute, false)
	}
	kept := func() string {
		a := q.answer(t0)
		require.NotNil(t, a)
		return a.resp.Header.Get("RateLimit")
	}

	answer(`"w";r=2;t=1`, time.Time{}, t0)
	assert.Equal(t, `"w";r=2;t=1`, kept(), "the answer that showed the window")
	assert.Zero(t, q.take(at(10*time.Millisecond)))
	answer(`"w";r=1;t=0.9`, at(10*time.Millisecond), at(100*time.Millisecond))
	assert.Equal(t, `"w";r=2;t=1`, kept(), "an answer that says nothing new is not kept")
	answer(`"w";r=0;t=0.8`, at(150*time.Millisecond), at(200*time.Millisecond))
	assert.Equal(t, `"w";r=0;t=0.8`, kept(), "the answer that said none was left")

	// The next window, predicted at the reset, then confirmed by its first
	// answer.
	assert.Zero(t, q.take(at(1050*time.Millisecond)))
	answer(`"w";r=2;t=0.9`, at(1050*time.Millisecond), at(1100*time.Millisecond))
	assert.Equal(t, `"w";r=2;t=0.9`, kept(), "the first answer of the new window")
	assert.Equal(t, "w", q.answer(t0).quota)
}
