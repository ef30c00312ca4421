package resilience

import (
	"context"
	"time"
)

// Per-request overrides travel in the request's context, so that one call
// can differ from its handler's options without another handler. The .NET
// handler has no such thing (dotnet/extensions#5048).

// overrides is what a request's context changes; one context value holds
// all of them, so a request costs one lookup whatever it overrides.
type overrides struct {
	retryable  int8 // 0: the method rule; 1: repeatable; -1: not
	attempt    time.Duration
	total      time.Duration
	hasAttempt bool
	hasTotal   bool
	report     *Report // filled in when the call returns
}

type overridesKey struct{}

func overridesFrom(ctx context.Context) *overrides {
	o, _ := ctx.Value(overridesKey{}).(*overrides)
	return o
}

func withOverride(ctx context.Context, set func(*overrides)) context.Context {
	var o overrides
	if prev := overridesFrom(ctx); prev != nil {
		o = *prev
	}
	set(&o)
	return context.WithValue(ctx, overridesKey{}, &o)
}

// WithRetryable returns a context whose requests are safe to repeat
// whatever their method, or, if retryable is false, never.
func WithRetryable(ctx context.Context, retryable bool) context.Context {
	return withOverride(ctx, func(o *overrides) {
		o.retryable = -1
		if retryable {
			o.retryable = 1
		}
	})
}

// WithAttemptTimeout returns a context whose requests have d as their
// attempt timeout instead of AttemptTimeout; a negative d turns it off.
// Where TotalTimeout is a default, their total timeout is at least 3 × d,
// as an Options.AttemptTimeout of d would make it; an explicit
// TotalTimeout, or WithTotalTimeout, still bounds their attempts.
func WithAttemptTimeout(ctx context.Context, d time.Duration) context.Context {
	return withOverride(ctx, func(o *overrides) { o.attempt, o.hasAttempt = d, true })
}

// WithTotalTimeout returns a context whose requests have d as their total
// timeout instead of TotalTimeout; a negative d turns it off.
func WithTotalTimeout(ctx context.Context, d time.Duration) context.Context {
	return withOverride(ctx, func(o *overrides) { o.total, o.hasTotal = d, true })
}
