package resilience

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Defaults of RetryOptions: what a zero field means.
const (
	defaultMaxRetries    = 3
	defaultRetryDelay    = 2 * time.Second
	defaultMaxRetryDelay = 30 * time.Second
)

// RetryOptions configures the retry layer, which retries the transient
// failures of requests safe to repeat. A retry waits for a delay or a 429's
// or 503's Retry-After, unless the wait would end past the call's deadline:
// the caller then gets the failed attempt's outcome. See docs/retries.md.
type RetryOptions struct {
	Disabled   bool // turns retries off; default false
	MaxRetries int  // repeats after the first attempt; default 3

	// Delay is the base delay between attempts. Default 2s; negative means
	// none: retries go at once, whatever Backoff and MaxDelay say.
	Delay time.Duration

	MaxDelay time.Duration // caps the computed delay; default 30s
	Backoff  BackoffType   // how the delay grows; default BackoffExponential
	NoJitter bool          // turns off the ±50% jitter; default false

	// Methods adds methods to those retried, only GET by default, and
	// ExcludeMethods removes some, GET included. The rule holds for every
	// outcome; WithRetryable overrides it for one request.
	Methods        []string
	ExcludeMethods []string

	// IgnoreRetryAfter makes retries wait the computed delay instead of a
	// Retry-After; after one over MaxRetryAfter, the caller gets the response
	// at once. Default false, and 0: no cap.
	IgnoreRetryAfter bool
	MaxRetryAfter    time.Duration

	// ShouldRetry, if set, replaces the default [IsTransient], for hedges too.
	// It must be safe for concurrent use, and must not modify or keep the
	// request, nor read or close the response body.
	ShouldRetry func(req *http.Request, resp *http.Response, err error) bool

	// DelayFunc, if set, returns each retry's delay, not capped by MaxDelay;
	// negative keeps the computed delay, the default. An honoured Retry-After
	// wins. It must be safe for concurrent use and return quickly.
	DelayFunc func(DelayInfo) time.Duration
}

var retryFields = fieldSet[RetryOptions]{
	"disabled":   boolField(func(o *RetryOptions) *bool { return &o.Disabled }),
	"maxRetries": maxRetriesField,
	"delay":      retryDelayField,
	"maxDelay": durationField(func(o *RetryOptions) *time.Duration { return &o.MaxDelay },
		keepZero),
	"backoff":          backoffField,
	"noJitter":         boolField(func(o *RetryOptions) *bool { return &o.NoJitter }),
	"methods":          stringsField(func(o *RetryOptions) *[]string { return &o.Methods }),
	"excludeMethods":   stringsField(func(o *RetryOptions) *[]string { return &o.ExcludeMethods }),
	"ignoreRetryAfter": boolField(func(o *RetryOptions) *bool { return &o.IgnoreRetryAfter }),
	"maxRetryAfter":    durationField(func(o *RetryOptions) *time.Duration { return &o.MaxRetryAfter }, keepZero),
}

// maxRetriesField reads retry.maxRetries; a written 0 meant no retries.
var maxRetriesField = intField(func(o *RetryOptions) *int { return &o.MaxRetries },
	refuseZero("no retries", `"disabled": true`))

// retryDelayField reads retry.delay; a written 0 meant no delay.
var retryDelayField = durationField(func(o *RetryOptions) *time.Duration { return &o.Delay },
	refuseZero("no delay", `a negative duration such as "-1s" for no delay`))

func backoffField(o *RetryOptions, raw json.RawMessage, path string) error {
	var s string
	_ = json.Unmarshal(raw, &s)
	for _, b := range []BackoffType{BackoffExponential, BackoffLinear, BackoffConstant} {
		if s == b.String() {
			o.Backoff = b
			return nil
		}
	}
	return configErr(path, "want \"exponential\", \"linear\" or \"constant\", got %s", brief(raw))
}

// resolveRetry fills in the retry layer's defaults and validates it.
func resolveRetry(r *RetryOptions, bad badOption) error {
	switch {
	case r.MaxRetries < 0:
		return bad("Retry.MaxRetries", r.MaxRetries, "must not be negative; set Retry.Disabled to turn retries off")
	case r.MaxDelay < 0:
		return bad("Retry.MaxDelay", r.MaxDelay, "must not be negative")
	case r.Backoff < BackoffExponential || r.Backoff > BackoffConstant:
		return bad("Retry.Backoff", r.Backoff, "must be BackoffExponential, BackoffLinear or BackoffConstant")
	case r.MaxRetryAfter < 0:
		return bad("Retry.MaxRetryAfter", r.MaxRetryAfter, "must not be negative; zero means no cap but TotalTimeout")
	}
	if r.MaxRetries == 0 {
		r.MaxRetries = defaultMaxRetries
	}
	if r.Delay == 0 {
		r.Delay = defaultRetryDelay
		if r.MaxDelay > 0 {
			r.Delay = min(r.Delay, r.MaxDelay) // the default yields to a shorter MaxDelay
		}
	}
	if r.MaxDelay > 0 && r.Delay > r.MaxDelay {
		return bad("Retry.MaxDelay", r.MaxDelay, fmt.Sprintf("must not be below Retry.Delay (%v)", r.Delay))
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = max(defaultMaxRetryDelay, r.Delay)
	}
	return nil
}

// BackoffType says how the delay between retries grows.
type BackoffType int

// Backoff types. The zero value is BackoffExponential.
const (
	BackoffExponential BackoffType = iota // Delay, 2*Delay, 4*Delay, ...
	BackoffLinear                         // Delay, 2*Delay, 3*Delay, ...
	BackoffConstant                       // Delay, Delay, Delay, ...
)

func (b BackoffType) String() string {
	switch b {
	case BackoffExponential:
		return "exponential"
	case BackoffLinear:
		return "linear"
	case BackoffConstant:
		return "constant"
	}
	return fmt.Sprintf("BackoffType(%d)", int(b))
}

// DelayInfo is what RetryOptions.DelayFunc is told of the next retry; it
// must not modify or keep Request, nor read or close Response's body.
type DelayInfo struct {
	Retry    int            // the retry's number, from 1
	Delay    time.Duration  // the computed delay; 0 if RetryOptions.Delay < 0, or for a failover after a connection failure
	Response *http.Response // the failed attempt's response, or nil
	Err      error          // the failed attempt's error, or nil
	Request  *http.Request  // the caller's request
}
