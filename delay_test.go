package resilience

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
