package resilience

import (
	"context"
	"math"
	"time"
)

// Defaults of RateLimitOptions: what a zero field means.
const (
	defaultMaxConcurrent = 1000
)

// RateLimitOptions configures admission control: the calls in flight, a
// rate, and the quota the upstream announces; a call refused fails with
// [ErrRateLimited]. A permit is held until the response body is closed or
// read to EOF, or the total timeout ends the call.
type RateLimitOptions struct {
	Disabled      bool // turns admission control off; default false
	MaxConcurrent int  // most calls in flight; default 1000
	MaxQueue      int  // calls that may wait for a permit; default 0

	// RequestsPerSecond, if positive, is the rate calls may start at, and
	// Burst, which needs it, how many at once (0: spaced evenly). Default 0.
	RequestsPerSecond float64
	Burst             int

	// Wait makes a call over a rate wait, holding its concurrency permit, for
	// a permit due before its deadline, instead of failing. Default false.
	Wait bool

	// Shared, if set, is a rate shared with other processes, such as a
	// redislimit.Limiter. A configuration file cannot set it. Default nil.
	Shared SharedRate

	// IgnoreServerQuota stops calls being held back, as Wait says, by the
	// quota the upstream announces in RateLimit or X-RateLimit-* fields.
	// Default false. See docs/server-pacing.md.
	IgnoreServerQuota bool

	// PauseOn429 makes a 429 with Retry-After but no quota fields hold back
	// every call (of its host, with PerHost) too. Default false.
	PauseOn429 bool
}

var rateLimitFields = fieldSet[RateLimitOptions]{
	"disabled": boolField(func(o *RateLimitOptions) *bool { return &o.Disabled }),
	"maxConcurrent": intField(func(o *RateLimitOptions) *int { return &o.MaxConcurrent },
		keepZero),
	"maxQueue":          intField(func(o *RateLimitOptions) *int { return &o.MaxQueue }, keepZero),
	"requestsPerSecond": floatField(func(o *RateLimitOptions) *float64 { return &o.RequestsPerSecond }, keepZero),
	"burst":             intField(func(o *RateLimitOptions) *int { return &o.Burst }, keepZero),
	"wait":              boolField(func(o *RateLimitOptions) *bool { return &o.Wait }),
	"ignoreServerQuota": boolField(func(o *RateLimitOptions) *bool { return &o.IgnoreServerQuota }),
	"pauseOn429":        boolField(func(o *RateLimitOptions) *bool { return &o.PauseOn429 }),
}

// resolveRateLimit fills in admission control's defaults and validates it.
func resolveRateLimit(rl *RateLimitOptions, bad badOption) error {
	switch {
	case rl.MaxConcurrent < 0:
		return bad("RateLimit.MaxConcurrent", rl.MaxConcurrent, "must not be negative")
	case rl.MaxQueue < 0:
		return bad("RateLimit.MaxQueue", rl.MaxQueue, "must not be negative")
	case math.IsNaN(rl.RequestsPerSecond) || math.IsInf(rl.RequestsPerSecond, 0) || rl.RequestsPerSecond < 0:
		return bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be a finite number, zero or more")
	case rl.RequestsPerSecond > 1e9:
		return bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be at most 1e9")
	case rl.RequestsPerSecond > 0 && rl.RequestsPerSecond < 1e-3:
		return bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be at least 0.001 (one call in 1000s) when set")
	case rl.Burst < 0:
		return bad("RateLimit.Burst", rl.Burst, "must not be negative")
	case rl.Burst > 1_000_000:
		return bad("RateLimit.Burst", rl.Burst, "must be at most 1000000")
	case rl.Burst > 0 && rl.RequestsPerSecond == 0:
		return bad("RateLimit.Burst", rl.Burst, "needs RequestsPerSecond")
	}
	if rl.MaxConcurrent == 0 {
		rl.MaxConcurrent = defaultMaxConcurrent
	}
	return nil
}

// A SharedRate is a rate shared by processes through a store, such as a
// redislimit.Limiter, of which every call takes a permit once admitted. It
// must be safe for concurrent use. See docs/shared-rate-limit.md.
type SharedRate interface {
	// Take takes a permit of the rate named key, or says in Wait when one is
	// due. An error but ctx's refuses the call with ErrRateLimited.
	Take(ctx context.Context, key string) (SharedRateResult, error)
}

// A SharedRateResult is a SharedRate's answer to Take.
type SharedRateResult struct {
	Wait     time.Duration // zero with a permit, or else time to the next
	Fallback error         // if not nil, why the store used a local rate
}
