package resilience

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackOffSequences(t *testing.T) {
	next := func(r RetryOptions, n int) []time.Duration {
		b := newBackOff(r)
		var ds []time.Duration
		for range n {
			ds = append(ds, b.NextBackOff())
		}
		return ds
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 100 * ms, 100 * ms},
		next(RetryOptions{Delay: 10 * ms, MaxDelay: 100 * ms, NoJitter: true}, 6), "exponential, capped")
	assert.Equal(t, []time.Duration{10 * ms, 20 * ms, 30 * ms, 35 * ms},
		next(RetryOptions{Delay: 10 * ms, MaxDelay: 35 * ms, NoJitter: true, Backoff: BackoffLinear}, 4), "linear, capped")
	assert.Equal(t, []time.Duration{10 * ms, 10 * ms, 10 * ms},
		next(RetryOptions{Delay: 10 * ms, MaxDelay: 35 * ms, NoJitter: true, Backoff: BackoffConstant}, 3), "constant")
}

// Jittered delays stay within MaxDelay and, once the cap is reached, stay
// spread instead of piling up on it.
func TestBackOffJitterAtTheCap(t *testing.T) {
	for _, kind := range []BackoffType{BackoffExponential, BackoffLinear, BackoffConstant} {
		r := RetryOptions{Delay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond, Backoff: kind}
		atCap, late := 0, 0
		for range 200 {
			b := newBackOff(r)
			for i := range 8 {
				d := b.NextBackOff()
				assert.LessOrEqual(t, d, r.MaxDelay, "%v: never past MaxDelay", kind)
				assert.GreaterOrEqual(t, d, r.Delay/2, "%v: never under half the base delay", kind)
				if i >= 4 {
					late++
					if d == r.MaxDelay {
						atCap++
					}
				}
			}
		}
		assert.Less(t, atCap, late/20, "%v: %d of %d late delays exactly at MaxDelay", kind, atCap, late)
	}
}

// A negative Delay means no delay, whatever the backoff shape and MaxDelay.
func TestBackOffNoDelay(t *testing.T) {
	for _, kind := range []BackoffType{BackoffExponential, BackoffLinear, BackoffConstant} {
		for _, r := range []RetryOptions{
			{Delay: -1, Backoff: kind},
			{Delay: -time.Second, MaxDelay: time.Minute, Backoff: kind},
		} {
			b := newBackOff(r)
			for i := range 5 {
				assert.Zero(t, b.NextBackOff(), "%v, delay %d", r, i+1)
			}
		}
	}
}

// statusUntil is an upstream handler that answers 503 to the first n
// requests and 200 "ok" to the rest.
func statusUntil(n int) func(w http.ResponseWriter, r *http.Request, i int) {
	return func(w http.ResponseWriter, r *http.Request, i int) {
		if i <= n {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}
}

// retryDelays returns the Delay of each EventRetry c saw.
func retryDelays(c *testClient) []time.Duration {
	var ds []time.Duration
	for _, e := range c.events.ofKind(EventRetry) {
		ds = append(ds, e.Delay)
	}
	return ds
}

// A negative Delay retries at once, with every backoff shape, MaxDelay or
// not.
func TestRetryNegativeDelayRetriesAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		retry RetryOptions
	}{
		{"exponential", RetryOptions{Delay: -1}},
		{"linear", RetryOptions{Delay: -1, Backoff: BackoffLinear, NoJitter: true}},
		{"constant", RetryOptions{Delay: -time.Second, Backoff: BackoffConstant}},
		{"MaxDelay set too", RetryOptions{Delay: -1, MaxDelay: time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newTestUpstream(t, statusUntil(3))
			c := newTestClient(t, Options{Retry: tc.retry})
			resp, err := c.getBounded(t, u.URL())
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "ok", readBody(t, resp))
			assert.EqualValues(t, 4, u.requests.Load())
			assert.Equal(t, []time.Duration{0, 0, 0}, retryDelays(c))
		})
	}
}

// delayFuncLog records what DelayFunc was told and answers from a list.
type delayFuncLog struct {
	mu      sync.Mutex
	infos   []DelayInfo
	answers []time.Duration // the n-th call's answer; the last repeats
}

func (l *delayFuncLog) delay(info DelayInfo) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, info)
	return l.answers[min(len(l.infos), len(l.answers))-1]
}

func (l *delayFuncLog) calls() []DelayInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]DelayInfo(nil), l.infos...)
}

type delayTestKey struct{}

// DelayFunc gets each retry's number, the computed delay, the failed
// outcome and the request, and what it returns is waited: zero retries at
// once, a negative value means the computed delay, and MaxDelay does not
// cap it.
func TestRetryDelayFuncDecidesDelay(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			resetConn(t, w)
		case 2, 3:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			io.WriteString(w, "ok")
		}
	})
	ms := time.Millisecond
	f := &delayFuncLog{answers: []time.Duration{0, 20 * ms, -1}}
	c := newTestClient(t, Options{Retry: RetryOptions{
		Delay: ms, MaxDelay: 3 * ms, NoJitter: true, DelayFunc: f.delay,
	}})
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), delayTestKey{}, "order-42"), 10*time.Second)
	defer cancel()
	resp, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL()+"/orders", nil))
	require.NoError(t, err)
	assert.Equal(t, "ok", readBody(t, resp))
	assert.EqualValues(t, 4, u.requests.Load())

	infos := f.calls()
	require.Len(t, infos, 3)
	for i, info := range infos {
		assert.Equal(t, i+1, info.Retry, "retry numbers count from 1")
		require.NotNil(t, info.Request)
		assert.Equal(t, "/orders", info.Request.URL.Path)
		assert.Equal(t, "order-42", info.Request.Context().Value(delayTestKey{}), "the caller's request, with its context")
	}
	assert.Equal(t, []time.Duration{ms, 2 * ms, 3 * ms}, []time.Duration{infos[0].Delay, infos[1].Delay, infos[2].Delay},
		"the computed delays, exponential and capped by MaxDelay")
	assert.Nil(t, infos[0].Response, "the connection was reset")
	assert.Error(t, infos[0].Err)
	for _, info := range infos[1:] {
		require.NotNil(t, info.Response)
		assert.Equal(t, http.StatusServiceUnavailable, info.Response.StatusCode)
		assert.NoError(t, info.Err)
	}
	assert.Equal(t, []time.Duration{0, 20 * ms, 3 * ms}, retryDelays(c),
		"zero at once, 20ms beyond MaxDelay as returned, negative: the computed 3ms")
}

// A DelayFunc that always returns a negative delay leaves every computed
// delay as it is.
func TestRetryDelayFuncNegativeUsesComputedDelay(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		retry RetryOptions
		want  []time.Duration
	}{
		{"linear", RetryOptions{Delay: ms, MaxDelay: time.Second, NoJitter: true, Backoff: BackoffLinear}, []time.Duration{ms, 2 * ms, 3 * ms}},
		{"exponential", RetryOptions{Delay: ms, MaxDelay: time.Second, NoJitter: true}, []time.Duration{ms, 2 * ms, 4 * ms}},
		{"no delay", RetryOptions{Delay: -1}, []time.Duration{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newTestUpstream(t, statusUntil(3))
			f := &delayFuncLog{answers: []time.Duration{-time.Hour, -1}}
			tc.retry.DelayFunc = f.delay
			c := newTestClient(t, Options{Retry: tc.retry})
			resp, err := c.getBounded(t, u.URL())
			require.NoError(t, err)
			assert.Equal(t, "ok", readBody(t, resp))
			assert.Len(t, f.calls(), 3)
			assert.Equal(t, tc.want, retryDelays(c))
		})
	}
}

// A Retry-After the server sent wins over DelayFunc, which is then not
// asked; with IgnoreRetryAfter, DelayFunc decides.
func TestRetryAfterWinsOverDelayFunc(t *testing.T) {
	t.Parallel()
	retryAfter := func(value string) func(w http.ResponseWriter, r *http.Request, n int) {
		return func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				w.Header().Set("Retry-After", value)
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "try later")
				return
			}
			io.WriteString(w, "ok")
		}
	}
	ms := time.Millisecond

	t.Run("honoured", func(t *testing.T) {
		t.Parallel()
		u := newTestUpstream(t, retryAfter("0"))
		// An hour would not fit in the total timeout: had it been used,
		// the caller would have got the 503.
		f := &delayFuncLog{answers: []time.Duration{time.Hour}}
		c := newTestClient(t, Options{Retry: RetryOptions{Delay: -1, DelayFunc: f.delay}})
		resp, err := c.getBounded(t, u.URL())
		require.NoError(t, err)
		assert.Equal(t, "ok", readBody(t, resp))
		assert.Empty(t, f.calls())
		assert.Equal(t, []time.Duration{0}, retryDelays(c))
	})
	t.Run("ignored", func(t *testing.T) {
		t.Parallel()
		u := newTestUpstream(t, retryAfter("600"))
		f := &delayFuncLog{answers: []time.Duration{2 * ms}}
		retry := quickRetry()
		retry.IgnoreRetryAfter, retry.DelayFunc = true, f.delay
		c := newTestClient(t, Options{Retry: retry})
		resp, err := c.getBounded(t, u.URL())
		require.NoError(t, err)
		assert.Equal(t, "ok", readBody(t, resp))
		assert.Len(t, f.calls(), 1)
		assert.Equal(t, []time.Duration{2 * ms}, retryDelays(c))
	})
	t.Run("beyond MaxRetryAfter", func(t *testing.T) {
		t.Parallel()
		u := newTestUpstream(t, retryAfter("20"))
		f := &delayFuncLog{answers: []time.Duration{0}}
		retry := quickRetry()
		retry.MaxRetryAfter, retry.DelayFunc = time.Second, f.delay
		c := newTestClient(t, Options{Retry: retry})
		resp, err := c.getBounded(t, u.URL())
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "try later", readBody(t, resp))
		assert.EqualValues(t, 1, u.requests.Load(), "the Retry-After still ends the retries")
		assert.Empty(t, f.calls())
		assert.Empty(t, c.events.ofKind(EventRetry))
	})
}

// A delay from DelayFunc that would end past the call's deadline is not
// waited: the caller gets the response at once.
func TestRetryDelayFuncBeyondDeadlineAnswersAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
		ctx  time.Duration // the request context's timeout
	}{
		{"total timeout", Options{TotalTimeout: 2 * time.Second, AttemptTimeout: time.Second}, 10 * time.Second},
		{"request deadline", Options{TotalTimeout: -1}, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "busy")
			})
			f := &delayFuncLog{answers: []time.Duration{time.Hour}}
			tc.opts.Retry = RetryOptions{Delay: -1, DelayFunc: f.delay}
			c := newTestClient(t, tc.opts)
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			start := time.Now()
			resp, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL(), nil))
			elapsed := time.Since(start)
			require.NoError(t, err)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, "busy", readBody(t, resp), "the response is returned untouched")
			assert.EqualValues(t, 1, u.requests.Load())
			assert.Len(t, f.calls(), 1)
			assert.Empty(t, c.events.ofKind(EventRetry))
			assert.Less(t, elapsed, time.Second, "no wait into the deadline")
		})
	}
}

// DelayInfo is passed by value: a retry asks DelayFunc without allocating.
func TestRetryDelayFuncAllocatesNothing(t *testing.T) {
	perCall := func(retry RetryOptions) float64 {
		base := &orRoundTripper{f: func(n int) (*http.Response, error) {
			if n%2 == 0 {
				return orStatus("503 Service Unavailable"), nil
			}
			return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Body: http.NoBody}, nil
		}}
		tr, err := NewTransport(base, Options{Retry: retry, CircuitBreaker: CircuitBreakerOptions{Disabled: true}})
		require.NoError(t, err)
		req := newTestRequest(t, context.Background(), http.MethodGet, "http://upstream.test/", nil)
		call := func() {
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("call: %v %v", resp, err)
			}
			resp.Body.Close()
		}
		for range 100 {
			call() // warm up pools
		}
		const runs = 2000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			call()
		}
		runtime.ReadMemStats(&after)
		return float64(after.Mallocs-before.Mallocs) / runs
	}
	var asked atomic.Int64
	without := perCall(RetryOptions{Delay: -1})
	with := perCall(RetryOptions{Delay: -1, DelayFunc: func(info DelayInfo) time.Duration {
		asked.Add(1)
		return info.Delay
	}})
	t.Logf("allocations per call with one retry: %.2f without DelayFunc, %.2f with", without, with)
	assert.EqualValues(t, 2100, asked.Load(), "DelayFunc asked once per call")
	// A per-retry allocation would add 1 per call; the margin absorbs the
	// race detector's randomly dropped sync.Pool entries.
	assert.Less(t, with, without+0.5)
}
