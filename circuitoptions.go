package resilience

import (
	"fmt"
	"math"
	"net/http"
	"time"
)

// Defaults of CircuitBreakerOptions: what a zero field means.
const (
	defaultFailureRatio      = 0.9
	defaultMinimumThroughput = 100
	defaultSamplingDuration  = 30 * time.Second
	defaultBreakDuration     = time.Second
)

// CircuitBreakerOptions configures the circuit breaker: the circuit opens
// when at least MinimumThroughput attempts in the last SamplingDuration
// include FailureRatio failures, and fails calls with [ErrCircuitOpen] until,
// after BreakDuration, a probe succeeds. See docs/circuit-breaker.md.
type CircuitBreakerOptions struct {
	Disabled          bool    // default false; IsolateCircuit still works
	FailureRatio      float64 // in (0, 1]; default 0.9
	MinimumThroughput int     // default 100

	// SamplingDuration is at least 1ms and twice AttemptTimeout. Default
	// 30s, or 2 × AttemptTimeout if longer.
	SamplingDuration time.Duration
	BreakDuration    time.Duration // default 1s

	// ShouldHandle, if set, replaces the default IsTransient; the caller's
	// cancellation and the total timeout never count.
	ShouldHandle func(*http.Response, error) bool
}

var circuitBreakerFields = fieldSet[CircuitBreakerOptions]{
	"disabled": boolField(func(o *CircuitBreakerOptions) *bool { return &o.Disabled }),
	"failureRatio": floatField(func(o *CircuitBreakerOptions) *float64 { return &o.FailureRatio },
		keepZero),
	"minimumThroughput": minimumThroughputField,
	"samplingDuration": durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.SamplingDuration },
		keepZero),
	"breakDuration": durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.BreakDuration },
		keepZero),
}

// minimumThroughputField reads circuitBreaker.minimumThroughput; a written
// 0 meant no minimum.
var minimumThroughputField = intField(func(o *CircuitBreakerOptions) *int { return &o.MinimumThroughput },
	refuseZero("no minimum", "1 for no minimum"))

// resolveCircuitBreaker fills in the circuit breaker's defaults, some of
// which follow attemptTimeout (resolved), and validates it.
func resolveCircuitBreaker(cb *CircuitBreakerOptions, attemptTimeout time.Duration, bad badOption) error {
	switch {
	case math.IsNaN(cb.FailureRatio) || cb.FailureRatio < 0 || cb.FailureRatio > 1:
		return bad("CircuitBreaker.FailureRatio", cb.FailureRatio, "must be in (0, 1]")
	case cb.MinimumThroughput < 0:
		return bad("CircuitBreaker.MinimumThroughput", cb.MinimumThroughput, "must not be negative")
	case cb.SamplingDuration < 0:
		return bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration, "must not be negative")
	case cb.SamplingDuration > 0 && cb.SamplingDuration < time.Millisecond:
		return bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration, "must be at least 1ms")
	case cb.BreakDuration < 0:
		return bad("CircuitBreaker.BreakDuration", cb.BreakDuration, "must not be negative")
	}
	if cb.FailureRatio == 0 {
		cb.FailureRatio = defaultFailureRatio
	}
	if cb.MinimumThroughput == 0 {
		cb.MinimumThroughput = defaultMinimumThroughput
	}
	if cb.SamplingDuration == 0 {
		cb.SamplingDuration = max(defaultSamplingDuration, scaled(attemptTimeout, 2))
	}
	if cb.BreakDuration == 0 {
		cb.BreakDuration = defaultBreakDuration
	}
	// A default attempt timeout yielded to SamplingDuration (resolveTimeouts),
	// and a default SamplingDuration holds two attempt timeouts: only
	// explicit values get here.
	if !cb.Disabled && attemptTimeout > 0 && cb.SamplingDuration < scaled(attemptTimeout, 2) {
		return bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration,
			fmt.Sprintf("must be at least twice AttemptTimeout (%v)", attemptTimeout))
	}
	return nil
}
