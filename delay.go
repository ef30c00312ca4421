package resilience

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// jitterFactor is the spread of a jittered delay: a delay d becomes a
// uniformly random value in [d*(1-f), d*(1+f)], then capped at MaxDelay.
const jitterFactor = 0.5

// newBackOff returns the delay sequence of one call's retries.
func newBackOff(r RetryOptions) backoff.BackOff {
	factor := jitterFactor
	if r.NoJitter {
		factor = 0
	}
	if r.Backoff == BackoffLinear {
		return &linearBackOff{delay: r.Delay, max: r.MaxDelay, factor: factor}
	}
	multiplier := 2.0
	if r.Backoff == BackoffConstant {
		multiplier = 1
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     r.Delay,
		RandomizationFactor: factor,
		Multiplier:          multiplier,
		MaxInterval:         r.MaxDelay,
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
	d := b.max
	if b.n <= int64(b.max/b.delay) {
		d = b.delay * time.Duration(b.n)
	}
	if b.factor == 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - b.factor + 2*b.factor*rand.Float64()))
}
