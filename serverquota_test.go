package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/internal/headers"
)

// sqUpstream enforces a quota of limit requests per fixed window, the
// first starting at its first request, and announces it on every response
// in the form given: "draft" (RateLimit and RateLimit-Policy, the reset in
// milliseconds as a decimal), "x" (X-RateLimit-*, delta seconds, decimal).
// A request over the quota gets a 429 with Retry-After.
type sqUpstream struct {
	*httptest.Server
	limit  int
	window time.Duration
	form   string

	mu       sync.Mutex
	start    time.Time
	perWin   map[int64]int // requests per window
	ok, over int
}

func sqNewUpstream(limit int, window time.Duration, form string) *sqUpstream {
	u := &sqUpstream{limit: limit, window: window, form: form, perWin: map[int64]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

func (u *sqUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	now := time.Now()
	if u.start.IsZero() {
		u.start = now
	}
	win := int64(now.Sub(u.start) / u.window)
	u.perWin[win]++
	used := u.perWin[win]
	reset := u.start.Add(time.Duration(win+1) * u.window).Sub(now)
	over := used > u.limit
	if over {
		u.over++
	} else {
		u.ok++
	}
	u.mu.Unlock()

	secs := fmt.Sprintf("%.3f", math.Ceil(float64(reset)/float64(time.Millisecond))/1000)
	left := max(0, u.limit-used)
	switch u.form {
	case "draft":
		w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%.3f`, u.limit, u.window.Seconds()))
		w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%s`, left, secs))
	case "x":
		w.Header().Set("X-RateLimit-Limit", fmt.Sprint(u.limit))
		w.Header().Set("X-RateLimit-Remaining", fmt.Sprint(left))
		w.Header().Set("X-RateLimit-Reset", secs)
	}
	if over {
		w.Header().Set("Retry-After", fmt.Sprint(int(math.Ceil(reset.Seconds()))))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// counts returns the requests answered 200 and 429, and the most windows
// any request fell in.
func (u *sqUpstream) counts() (ok, over int, windows int64, perWin map[int64]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	perWin = map[int64]int{}
	for w, n := range u.perWin {
		perWin[w] = n
		windows = max(windows, w+1)
	}
	return u.ok, u.over, windows, perWin
}

func sqOptions(rec *evRecorder, rl RateLimitOptions) Options {
	return Options{Name: "quota-test", RateLimit: rl, OnEvent: rec.add}
}

// sqGet makes one GET and reads its body.
func sqGet(ctx context.Context, rt http.RoundTripper, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// The done-when, in short windows: 200 calls from 8 goroutines,
// waiting, against 50 per 500 ms, get no 429 and use no more windows than
// the quota needs (four).
func TestServerQuotaPacesConcurrentCallers(t *testing.T) {
	for _, form := range []string{"draft", "x"} {
		t.Run(form, func(t *testing.T) {
			const limit, callers, calls = 50, 8, 200
			up := sqNewUpstream(limit, 500*time.Millisecond, form)
			defer up.Close()
			rec := &evRecorder{}
			h, err := NewHandler(sqOptions(rec, RateLimitOptions{Wait: true}))
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: callers})
			defer tr.CloseIdleConnections()

			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, calls)
			for g := 0; g < callers; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= calls {
						status, err := sqGet(context.Background(), tr, up.URL)
						if err == nil && status != http.StatusOK {
							err = fmt.Errorf("status %d", status)
						}
						if err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				assert.NoError(t, err)
			}
			ok, over, windows, perWin := up.counts()
			assert.Equal(t, calls, ok, "every call answered 200")
			assert.Zero(t, over, "no 429 collected")
			assert.LessOrEqual(t, windows, int64(calls/limit), "no more windows than the quota needs: %v", perWin)
			assert.Zero(t, rec.count(EventRateLimited), "callers that wait are never refused")
			assert.Zero(t, admHeldPermits(h))
		})
	}
}

func TestServerQuotaFailFastSaysWhenTheResetIs(t *testing.T) {
	up := sqNewUpstream(3, 2*time.Second, "draft")
	defer up.Close()
	rec := &evRecorder{}
	h, err := NewHandler(sqOptions(rec, RateLimitOptions{}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for i := 0; i < 3; i++ {
		status, err := sqGet(context.Background(), tr, up.URL)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
	}
	_, err = sqGet(context.Background(), tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "server", rle.Limit)
	// The window of 2 s began with the first call, a few milliseconds ago.
	assert.Greater(t, rle.RetryAfter, time.Second)
	assert.LessOrEqual(t, rle.RetryAfter, 2*time.Second)
	assert.Contains(t, err.Error(), `handler "quota-test": rate limited: over the server rate, next permit in`)

	ok, over, _, _ := up.counts()
	assert.Equal(t, 3, ok)
	assert.Zero(t, over, "the refused call was not sent")
	events := rec.of(EventRateLimited)
	require.Len(t, events, 1)
	assert.ErrorAs(t, events[0].Err, &rle)
}

func TestServerQuotaWaitRefusedPastDeadline(t *testing.T) {
	up := sqNewUpstream(1, 5*time.Second, "x")
	defer up.Close()
	opts := sqOptions(&evRecorder{}, RateLimitOptions{Wait: true})
	opts.TotalTimeout, opts.AttemptTimeout = time.Second, time.Second
	_, tr := sqTransport(t, opts)

	_, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	start := time.Now()
	_, err = sqGet(context.Background(), tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the reset is due past the deadline: refused at once, not waited for")
	assert.Less(t, time.Since(start), 500*time.Millisecond)
	ok, over, _, _ := up.counts()
	assert.Equal(t, 1, ok)
	assert.Zero(t, over)
}

// sqStatusUpstream answers with the statuses of its script in turn, then
// 200, each with the headers given; it counts requests.
type sqStatusUpstream struct {
	*httptest.Server
	hits atomic.Int64
}

func sqNewStatusUpstream(header http.Header, script ...int) *sqStatusUpstream {
	u := &sqStatusUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.hits.Add(1)
		for k, v := range header {
			w.Header()[k] = v
		}
		if int(n) <= len(script) {
			w.WriteHeader(script[n-1])
		}
		_, _ = io.WriteString(w, "answer")
	}))
	return u
}

func TestServerQuota429PausesOtherCalls(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Retry-After": {"1"}}, http.StatusTooManyRequests)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{PauseOn429: true})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	status, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)

	// Another call fails at once, unsent, and says when the pause ends.
	_, err = sqGet(context.Background(), tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "server", rle.Limit)
	assert.Greater(t, rle.RetryAfter, time.Duration(0))
	assert.LessOrEqual(t, rle.RetryAfter, time.Second)
	assert.EqualValues(t, 1, up.hits.Load())

}

func TestServerQuota429PauseWaited(t *testing.T) {
	// A 429 that announces the quota pauses every call without PauseOn429,
	// for its Retry-After (1 s), not its reset (0 s): Retry-After wins.
	up := sqNewStatusUpstream(http.Header{"Retry-After": {"1"}, "Ratelimit": {`"d";r=0;t=0`}}, http.StatusTooManyRequests)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{Wait: true})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	status, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	// A caller that waits is held until the pause is over, then sent.
	start := time.Now()
	status, err = sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "held for the Retry-After of 1s")
	assert.EqualValues(t, 2, up.hits.Load())
	assert.Zero(t, rec.count(EventRateLimited))
}

func TestServerQuota429RetryKeepsItsRetryAfter(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Retry-After": {"1"}}, http.StatusTooManyRequests)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{PauseOn429: true})
	opts.Retry = RetryOptions{Delay: time.Millisecond}
	_, tr := sqTransport(t, opts)

	status, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "the call's own retry is not held back by the pause it caused")
	assert.EqualValues(t, 2, up.hits.Load())
	retries := rec.of(EventRetry)
	require.Len(t, retries, 1)
	assert.Equal(t, time.Second, retries[0].Delay, "after its Retry-After, as before")
	assert.Zero(t, rec.count(EventRateLimited))
}

// A bare 429 with Retry-After may be one request's, and a 503 with one is
// an overloaded instance's: neither holds back the next call unless
// PauseOn429 says so (for the 429 only).
func TestServerQuotaBareRetryAfterDoesNotPauseOthers(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			up := sqNewStatusUpstream(http.Header{"Retry-After": {"30"}}, status)
			defer up.Close()
			opts := sqOptions(&evRecorder{}, RateLimitOptions{})
			opts.Retry.Disabled = true
			h, tr := sqTransport(t, opts)

			got, err := sqGet(context.Background(), tr, up.URL)
			require.NoError(t, err)
			require.Equal(t, status, got)
			got, err = sqGet(context.Background(), tr, up.URL)
			require.NoError(t, err, "the next call goes")
			assert.Equal(t, http.StatusOK, got)
			assert.False(t, h.shared.quota.active.Load())
		})
	}
}

func TestServerQuotaPerHost(t *testing.T) {
	spent := sqNewStatusUpstream(http.Header{"Retry-After": {"30"}}, http.StatusTooManyRequests)
	defer spent.Close()
	fine := sqNewStatusUpstream(http.Header{"Ratelimit": {`"default";r=1000;t=60`}})
	defer fine.Close()
	opts := sqOptions(&evRecorder{}, RateLimitOptions{PauseOn429: true})
	opts.Retry.Disabled = true
	opts.PerHost.Enabled = true
	_, tr := sqTransport(t, opts)

	status, err := sqGet(context.Background(), tr, spent.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	_, err = sqGet(context.Background(), tr, spent.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the host that answered 429 is paused")
	for i := 0; i < 3; i++ {
		status, err = sqGet(context.Background(), tr, fine.URL)
		require.NoError(t, err, "another host is not")
		assert.Equal(t, http.StatusOK, status)
	}
	assert.EqualValues(t, 1, spent.hits.Load())
	assert.EqualValues(t, 3, fine.hits.Load())
}

func TestServerQuotaClampsHostileValues(t *testing.T) {
	far := strconv.FormatInt(time.Now().Add(24*365*time.Hour).Unix(), 10)
	for _, tc := range []struct {
		name   string
		header http.Header
		status int
	}{
		{"huge t", http.Header{"Ratelimit": {`"d";r=0;t=999999999999999999999`}}, http.StatusOK},
		{"far-future Unix reset", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {far}}, http.StatusOK},
		{"huge Retry-After", http.Header{"Retry-After": {"99999999999999999999"}}, http.StatusTooManyRequests},
		{"far-future Retry-After date", http.Header{"Retry-After": {"Thu, 01 Jan 2099 00:00:00 GMT"}}, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := sqNewStatusUpstream(tc.header, tc.status, tc.status, tc.status, tc.status)
			defer up.Close()
			opts := sqOptions(&evRecorder{}, RateLimitOptions{PauseOn429: true})
			opts.Retry.Disabled = true
			_, tr := sqTransport(t, opts)

			_, err := sqGet(context.Background(), tr, up.URL)
			require.NoError(t, err)
			_, err = sqGet(context.Background(), tr, up.URL)
			var rle *RateLimitError
			require.ErrorAs(t, err, &rle)
			assert.LessOrEqual(t, rle.RetryAfter, maxServerWait, "clamped to a minute")
			assert.Greater(t, rle.RetryAfter, maxServerWait-10*time.Second)

			// With MaxRetryAfter, to that; a caller that waits is sent after it.
			opts.Retry.MaxRetryAfter = 30 * time.Millisecond
			opts.RateLimit.Wait = true
			h, err := NewHandler(opts)
			require.NoError(t, err)
			tr2 := h.Transport(&http.Transport{})
			defer tr2.CloseIdleConnections()
			_, err = sqGet(context.Background(), tr2, up.URL)
			require.NoError(t, err)
			hits := up.hits.Load()
			_, err = sqGet(context.Background(), tr2, up.URL)
			require.NoError(t, err, "waited 30 ms at most, then sent")
			assert.Equal(t, hits+1, up.hits.Load())
		})
	}
}

func TestServerQuotaWithoutHeadersChangesNothing(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"X-Other": {"1"}}, http.StatusInternalServerError, http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{})
	opts.Retry.Disabled = true
	h, tr := sqTransport(t, opts)

	for i := 0; i < 10; i++ {
		_, err := sqGet(context.Background(), tr, up.URL)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 10, up.hits.Load())
	assert.Zero(t, rec.count(EventRateLimited))
	q := &h.shared.quota
	assert.False(t, q.active.Load(), "nothing to follow")
	assert.Zero(t, q.sending.Load(), "every attempt's end was counted")
	assert.Nil(t, q.pause.Load())
}

func TestServerQuotaIgnored(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Ratelimit": {`"d";r=0;t=60`}, "Retry-After": {"60"}}, http.StatusTooManyRequests)
	defer up.Close()
	for _, rl := range []RateLimitOptions{{IgnoreServerQuota: true, PauseOn429: true}, {Disabled: true, PauseOn429: true}} {
		opts := sqOptions(&evRecorder{}, rl)
		opts.Retry.Disabled = true
		h, err := NewHandler(opts)
		require.NoError(t, err)
		tr := h.Transport(&http.Transport{})
		for i := 0; i < 3; i++ {
			_, err := sqGet(context.Background(), tr, up.URL)
			require.NoError(t, err, "%+v", rl)
		}
		tr.CloseIdleConnections()
		assert.False(t, h.shared.quota.active.Load())
	}
	assert.EqualValues(t, 6, up.hits.Load())
}

// When remaining = N, about N calls are let through before the reset, not
// every caller in flight.
func TestServerQuotaCountsCallsSentSinceTheAnswer(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Ratelimit": {`"d";r=5;t=30`}})
	defer up.Close()
	h, err := NewHandler(sqOptions(&evRecorder{}, RateLimitOptions{}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = sqGet(context.Background(), tr, up.URL) // says 5 are left
	require.NoError(t, err)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sqGet(context.Background(), tr, up.URL); errors.Is(err, ErrRateLimited) {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 6, up.hits.Load(), "the first call and the 5 left")
	assert.EqualValues(t, 15, refused.Load())
}

func TestLoadConfigIgnoreServerQuota(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"vendor": {"rateLimit": {"ignoreServerQuota": true, "pauseOn429": true}}}}`))
	require.NoError(t, err)
	assert.True(t, cfg.Upstreams["vendor"].RateLimit.IgnoreServerQuota)
	assert.True(t, cfg.Upstreams["vendor"].RateLimit.PauseOn429)

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"vendor": {"rateLimit": {"ignoreServerQuota": 1}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rateLimit.ignoreServerQuota")
}

// The window model, step by step, on a clock of its own.
func TestServerQuotaWindowModel(t *testing.T) {
	var q serverQuota
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	most := time.Minute
	// answer is the end of an attempt sent at sent, answered at now with r.
	answer := func(r headers.Quota, sent, now time.Time) {
		q.sending.Add(1)
		q.update(r, sent, now, most)
	}

	// The first answer: 3 left of 10 per second, until t0+1s, while 1
	// other attempt is on its way: 2 may go.
	q.sending.Store(1) // another attempt, sent before the quota was followed
	answer(headers.Quota{Remaining: 3, Reset: time.Second, HasReset: true, Limit: 10, Window: time.Second}, time.Time{}, t0)
	assert.True(t, q.active.Load())
	assert.Zero(t, q.take(at(10*time.Millisecond)))
	assert.Zero(t, q.take(at(20*time.Millisecond)))
	assert.Equal(t, 970*time.Millisecond, q.take(at(30*time.Millisecond)), "spent until the reset")
	// The other attempt's answer says 4 were left: the server counted it
	// before the first answer's 3, so it was in that figure: one is given
	// back.
	q.update(headers.Quota{Remaining: 4, Reset: time.Second, HasReset: true}, time.Time{}, at(40*time.Millisecond), most)
	assert.Zero(t, q.sending.Load())
	assert.Zero(t, q.take(at(45*time.Millisecond)))
	assert.Equal(t, 950*time.Millisecond, q.take(at(50*time.Millisecond)), "spent again")

	// Another client spends the same quota: an answer lowers the count,
	// and never raises it within the window.
	// A later reset within the window does not move it (t is rounded).
	answer(headers.Quota{Remaining: 5, Reset: 950 * time.Millisecond, HasReset: true}, at(50*time.Millisecond), at(60*time.Millisecond))
	assert.Equal(t, 900*time.Millisecond, q.take(at(100*time.Millisecond)), "still spent; the reset is as first said")

	// At the reset the next window starts with the announced quota.
	for i := 0; i < 10; i++ {
		require.Zero(t, q.take(at(time.Second+time.Duration(i)*time.Millisecond)), "call %d of the new window", i+1)
	}
	assert.Equal(t, 990*time.Millisecond, q.take(at(1010*time.Millisecond)), "the window's 10 are spent")

	// The answer to an attempt sent before the window began says nothing
	// of it, even that none is left.
	answer(headers.Quota{Remaining: 0, Reset: 10 * time.Millisecond, HasReset: true}, at(990*time.Millisecond), at(1020*time.Millisecond))
	assert.True(t, q.resetAt.Equal(at(2*time.Second)))

	// An answer from within the window replaces the predicted reset.
	answer(headers.Quota{Remaining: 0, Reset: 1005 * time.Millisecond, HasReset: true}, at(1001*time.Millisecond), at(1020*time.Millisecond))
	assert.True(t, q.resetAt.Equal(at(2025*time.Millisecond)))

	// A retry spends without asking.
	q.spend(at(1030 * time.Millisecond))
	assert.EqualValues(t, -1, q.remaining)

	// Windows that went by unseen: calls go until an answer says more.
	assert.Zero(t, q.take(at(10*time.Second)))
	assert.True(t, q.resetAt.IsZero())

	// A pause holds every call, counting none.
	q.pauseFor(at(10*time.Second), 2*time.Second)
	assert.Equal(t, 2*time.Second, q.take(at(10*time.Second)))
	q.pauseFor(at(10*time.Second), time.Second) // a shorter one does not shorten it
	assert.Equal(t, time.Second, q.take(at(11*time.Second)))
}

// sqTransport returns a handler with opts and its transport over a fresh
// http.Transport, whose idle connections close when the test ends.
func sqTransport(t *testing.T, opts Options) (*Handler, http.RoundTripper) {
	t.Helper()
	h, err := NewHandler(opts)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)
	return h, tr
}

// A 429's Retry-After takes precedence over the reset of the quota it
// announces (the rule in docs/server-pacing.md): with Retry-After: 1 and a reset 4 s away,
// calls go again after 1 s, and the next answer says what is left.
func TestServerQuotaRetryAfterWinsOverReset(t *testing.T) {
	var q serverQuota
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{
		"Retry-After": {"1"},
		"Ratelimit":   {`"default";r=0;t=4`},
	}}
	q.sending.Add(1)
	q.observe(nil, resp, resp.Header, t0, t0, time.Minute, false)
	assert.Equal(t, 500*time.Millisecond, q.take(t0.Add(500*time.Millisecond)), "paused until the Retry-After")
	assert.Zero(t, q.take(t0.Add(time.Second)), "Retry-After has passed: the call goes, not 3 s later at the reset")

	// Without a 429, the same reset is waited for.
	var q2 serverQuota
	q2.sending.Add(1)
	ok := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Ratelimit": {`"default";r=0;t=4`}}}
	q2.observe(nil, ok, ok.Header, t0, t0, time.Minute, false)
	assert.Equal(t, 3*time.Second, q2.take(t0.Add(time.Second)))
}

func TestServerQuotaRetryAfterWinsOverResetWaited(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Retry-After": {"1"}, "Ratelimit": {`"default";r=0;t=4`}}, http.StatusTooManyRequests)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{Wait: true})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	status, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	status, err = sqGet(ctx, tr, up.URL)
	require.NoError(t, err, "sent once the Retry-After of 1 s passed, before the reset 4 s away")
	assert.Equal(t, http.StatusOK, status)
	assert.EqualValues(t, 2, up.hits.Load())
}

// lowerCaseHeaders is a base RoundTripper of another kind than net/http's:
// the responses it hands back name their fields in lower case, as they
// came on the wire.
type lowerCaseHeaders struct{ base http.RoundTripper }

func (l lowerCaseHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	h := make(http.Header, len(resp.Header))
	for k, v := range resp.Header {
		h[strings.ToLower(k)] = v
	}
	resp.Header = h
	return resp, nil
}

// Issue 18, item 2: the quota and the Retry-After of a response are read
// whatever the case of their names.
func TestServerQuotaReadsNonCanonicalNames(t *testing.T) {
	up := sqNewStatusUpstream(http.Header{"Retry-After": {"1"}, "Ratelimit": {`"default";r=0;t=4`}}, http.StatusTooManyRequests)
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{})
	opts.Retry.Disabled = true
	h, err := NewHandler(opts)
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := h.Transport(lowerCaseHeaders{base})

	status, err := sqGet(context.Background(), tr, up.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	_, err = sqGet(context.Background(), tr, up.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the pause that \"retry-after\" and \"ratelimit\" asked for")
	var rle *RateLimitError
	require.ErrorAs(t, err, &rle)
	assert.Equal(t, "server", rle.Limit)
	assert.EqualValues(t, 1, up.hits.Load())
}
