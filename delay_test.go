package resilience

import (
	"io"
	"net/http"
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
