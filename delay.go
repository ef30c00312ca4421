package resilience

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// jitterFactor is the spread of a jittered delay: a base delay d becomes a
// uniformly random value in [d*(1-f), d*(1+f)].
const jitterFactor = 0.5

// newBackOff returns the delay sequence of one call's retries: all zero
// when Delay is negative, the retries then going at once.
//
// The base delay is capped at MaxDelay/(1+f) before jitter, so that jittered
// delays never exceed MaxDelay and, once the cap is reached, still spread
// over [MaxDelay/3, MaxDelay]. Capping after jitter instead would put half of
// them exactly on MaxDelay and line up again the clients jitter keeps apart.
func newBackOff(r RetryOptions) backoff.BackOff {
	if r.Delay < 0 {
		return &backoff.ZeroBackOff{}
	}
	factor := jitterFactor
	if r.NoJitter {
		factor = 0
	}
	ceiling := time.Duration(float64(r.MaxDelay) / (1 + factor))
	if r.Backoff == BackoffLinear {
		return &linearBackOff{delay: r.Delay, max: ceiling, factor: factor}
	}
	multiplier := 2.0
	if r.Backoff == BackoffConstant {
		multiplier = 1
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.Delay,
		RandomizationFactor: factor,
		Multiplier:          multiplier,
		MaxInterval:         ceiling,
		MaxElapsedTime:      0, // the retry layer and the total timeout decide when to stop
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	return b
}

// linearBackOff grows by Delay each time, which backoff/v4 does not offer.
type linearBackOff struct {
	delay, max time.Duration
	factor     float64
	n          int64
}

func (b *linearBackOff) Reset() { b.n = 0 }

func (b *linearBackOff) NextBackOff() time.Duration {
	b.n++
	d := max(b.max, b.delay) // Delay itself is never cut
	if b.n <= int64(d/b.delay) {
		d = b.delay * time.Duration(b.n)
	}
	if b.factor == 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - b.factor + 2*b.factor*rand.Float64()))
}
