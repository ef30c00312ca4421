package resilience

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"
)

// Defaults of the standard handler: what a zero field means.
const (
	defaultName               = "standard"
	defaultMaxConcurrent      = 1000
	defaultTotalTimeout       = 30 * time.Second
	defaultMaxRetries         = 3
	defaultRetryDelay         = 2 * time.Second
	defaultMaxRetryDelay      = 30 * time.Second
	defaultFailureRatio       = 0.9
	defaultMinimumThroughput  = 100
	defaultSamplingDuration   = 30 * time.Second
	defaultBreakDuration      = time.Second
	defaultAttemptTimeout     = 10 * time.Second
	defaultMaxBufferedBody    = 1 << 20
	defaultMaxHosts           = 1000
	defaultBudgetTokens       = 25
	defaultBudgetTokenRatio   = 0.2
	defaultBudgetRetrySuccess = 6
	defaultMaxHedges          = 1
	defaultHedgingDelay       = 2 * time.Second
	defaultHostIdleTimeout    = 5 * time.Minute
	defaultHedgingMinDelay    = time.Millisecond
	defaultMaxExtraLoad       = 0.05
)

// Options configures a [Handler]; the zero value is the standard handler. A
// zero field is its default, which yields to an explicit value it would
// contradict; contradicting values, and negative ones unless their field
// gives them a meaning, are errors. The layers, outermost first: Fallback,
// RateLimit, TotalTimeout, Retry or Hedging, CircuitBreaker, Overload,
// AttemptTimeout. See docs/defaults.md.
type Options struct {
	Name      string           // for errors, events, logs; default "standard"
	RateLimit RateLimitOptions // admission control, on by default
	Overload  OverloadOptions  // the overload limiter, on by default

	// TotalTimeout bounds the call from queueing to reading the body, as
	// http.Client.Timeout does. Default 30s; negative turns it off.
	TotalTimeout time.Duration

	Retry          RetryOptions          // the retry layer, on by default
	RetryBudget    RetryBudgetOptions    // the retry budget, on by default
	Hedging        HedgingOptions        // off by default; replaces Retry
	CircuitBreaker CircuitBreakerOptions // the circuit breaker, on by default

	// AttemptTimeout bounds each attempt until its response headers arrive,
	// at most TotalTimeout. Default 10s; negative turns it off.
	AttemptTimeout time.Duration

	PerHost PerHostOptions // per-host isolation, off by default

	// Endpoints, if set, are the base URLs of the attempts: retries and
	// hedges go to the next as Routing says, and each has a circuit breaker
	// and an overload limit of its own. At most 16, none by default; an
	// empty, non-nil list is an error.
	Endpoints []Endpoint
	Routing   Routing // how attempts go to Endpoints; default RouteOrdered

	// MaxBufferedBody is the most of a body without GetBody held to resend
	// it; a larger one is never retried. Default 1 MiB; negative holds none.
	MaxBufferedBody int64

	Fallback    FallbackOptions    // the fallback layer, off by default
	Idempotency IdempotencyOptions // idempotency keys, off by default

	// Logger, when set, logs events: one record per change of state (the
	// circuit, with why; the budget; the overload limiter; the shared
	// rate), and, for the kinds every call may emit (retries, timeouts,
	// rejections, refusals, hedges, fallbacks), one record per kind every
	// 10s with its count. Attempts and calls are Debug records. URL secrets
	// are redacted.
	Logger *slog.Logger

	// LogLevels sets the level of an event kind, which Logger then logs
	// one record per event, not counted: the way to see each rejection.
	LogLevels map[EventKind]slog.Level

	// OnEvent, when set, is called synchronously with every Event. It must
	// be safe for concurrent use and should return quickly.
	OnEvent func(Event)
}

// OverloadOptions configures the overload limiter: an adaptive limit on the
// attempts awaiting headers from the upstream, by their latency and losses.
// A call whose first attempt gets no slot in time fails with
// [ErrOverloaded]; a retry or hedge may be shed. See docs/overload.md.
type OverloadOptions struct {
	Disabled     bool          // turns the limiter off; default false
	MinLimit     int           // fewest attempts in flight allowed; default 8
	MaxLimit     int           // most allowed, at most 1000000; default 1000
	InitialLimit int           // where the limit starts; default 20
	MaxQueue     int           // how many attempts may wait; default 1000
	MaxQueueWait time.Duration // longest wait for a slot; default 1s
}

// Defaults of OverloadOptions.
const (
	defaultOverloadMinLimit     = 8
	defaultOverloadMaxLimit     = 1000
	defaultOverloadInitialLimit = 20
	defaultOverloadMaxQueue     = 1000
	defaultOverloadMaxQueueWait = time.Second
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

// PerHostOptions configures per-host isolation: each authority
// (scheme://host:port) gets its own circuit breaker and limits.
type PerHostOptions struct {
	Enabled bool // turns it on; default false; Update cannot change it

	// MaxHosts is how many hosts are kept, more only while in use (a call in
	// flight, or an open circuit). Default 1000.
	MaxHosts int

	IdleTimeout time.Duration // forget a host idle this long; default 5m
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

// HedgingOptions configures hedging, which replaces the retry layer: while
// no attempt has an acceptable outcome, another follows after Delay (at once
// after a failure), up to MaxHedges more; the first acceptable outcome wins.
// Only requests the method rule allows are hedged. Each hedge needs a closed
// circuit, and one after a failure a budget token. See docs/hedging.md.
type HedgingOptions struct {
	Enabled   bool          // off by default
	MaxHedges int           // attempts besides the first, at most 10; default 1
	Delay     time.Duration // how long before the next attempt; default 2s

	// DelayPercentile, in (0, 1), hedges the attempts slower than this
	// percentile of the last 5-10s' latencies, once 100 are seen. Default 0.
	DelayPercentile float64
	MinDelay        time.Duration // shortest adaptive delay; default 1ms
	MaxDelay        time.Duration // longest adaptive delay; default Delay

	// MaxExtraLoad caps the hedges sent while an attempt runs at this share
	// of the last 10s' calls, plus one: in (0, 10], or NoExtraLoadCap for no
	// cap. Default 0.05.
	MaxExtraLoad float64
}

// RetryBudgetOptions configures the retry budget of a handler's calls and
// hosts: a bucket of MaxTokens tokens, full at first. A retry, or a hedge
// after a failure, needs an unclaimed token and takes it if it fails; one
// that succeeds puts back RetrySuccessTokens, a successful first attempt
// TokenRatio. A call refused a retry ends on its last outcome. See
// docs/retries.md.
type RetryBudgetOptions struct {
	Disabled           bool    // turns the budget off; default false
	MaxTokens          float64 // in [1, 1000]; default 25
	TokenRatio         float64 // in [0.001, 1]; default 0.2
	RetrySuccessTokens float64 // in (0, 1000]; default 6
}

// CircuitBreakerOptions configures the circuit breaker: the circuit opens
// when at least MinimumThroughput attempts in the last SamplingDuration
// include FailureRatio failures, and fails calls with [ErrCircuitOpen] until,
// after BreakDuration, a probe succeeds. See docs/circuit-breaker.md.
type CircuitBreakerOptions struct {
	Disabled          bool    // default false; IsolateCircuit still works
	FailureRatio      float64 // in (0, 1]; default 0.9
	MinimumThroughput int     // default 100

	// SamplingDuration is at least 1ms and twice AttemptTimeout. Default 30s.
	SamplingDuration time.Duration
	BreakDuration    time.Duration // default 1s

	// ShouldHandle, if set, replaces the default IsTransient; the caller's
	// cancellation and the total timeout never count.
	ShouldHandle func(*http.Response, error) bool
}

// config is Options with defaults filled in and validated.
type config struct {
	Options
	methods methodSet
	route   *router     // Endpoints resolved; nil without
	logs    *logSummary // the counts of Logger's summarised kinds; nil without Logger
}

// optionError names the field a user got wrong.
type optionError struct {
	handler string
	field   string
	value   any
	reason  string
}

func (e *optionError) Error() string {
	return fmt.Sprintf("resilience: handler %q: invalid option %s (%v): %s", e.handler, e.field, e.value, e.reason)
}

// resolve fills in defaults and validates o.
func resolve(o Options) (*config, error) {
	if o.Name == "" {
		o.Name = defaultName
	}
	bad := func(field string, value any, reason string) error {
		return &optionError{handler: o.Name, field: field, value: value, reason: reason}
	}

	// Admission control.
	rl := &o.RateLimit
	switch {
	case rl.MaxConcurrent < 0:
		return nil, bad("RateLimit.MaxConcurrent", rl.MaxConcurrent, "must not be negative")
	case rl.MaxQueue < 0:
		return nil, bad("RateLimit.MaxQueue", rl.MaxQueue, "must not be negative")
	case math.IsNaN(rl.RequestsPerSecond) || math.IsInf(rl.RequestsPerSecond, 0) || rl.RequestsPerSecond < 0:
		return nil, bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be a finite number, zero or more")
	case rl.RequestsPerSecond > 1e9:
		return nil, bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be at most 1e9")
	case rl.RequestsPerSecond > 0 && rl.RequestsPerSecond < 1e-3:
		return nil, bad("RateLimit.RequestsPerSecond", rl.RequestsPerSecond, "must be at least 0.001 (one call in 1000s) when set")
	case rl.Burst < 0:
		return nil, bad("RateLimit.Burst", rl.Burst, "must not be negative")
	case rl.Burst > 1_000_000:
		return nil, bad("RateLimit.Burst", rl.Burst, "must be at most 1000000")
	case rl.Burst > 0 && rl.RequestsPerSecond == 0:
		return nil, bad("RateLimit.Burst", rl.Burst, "needs RequestsPerSecond")
	}
	if rl.MaxConcurrent == 0 {
		rl.MaxConcurrent = defaultMaxConcurrent
	}

	// The overload limiter: validated even when disabled, since a live
	// Update may switch it on.
	ov := &o.Overload
	switch {
	case ov.MinLimit < 0:
		return nil, bad("Overload.MinLimit", ov.MinLimit, "must not be negative")
	case ov.MaxLimit < 0:
		return nil, bad("Overload.MaxLimit", ov.MaxLimit, "must not be negative")
	case ov.InitialLimit < 0:
		return nil, bad("Overload.InitialLimit", ov.InitialLimit, "must not be negative")
	case ov.MaxQueue < 0:
		return nil, bad("Overload.MaxQueue", ov.MaxQueue, "must not be negative")
	case ov.MaxQueueWait < 0:
		return nil, bad("Overload.MaxQueueWait", ov.MaxQueueWait, "must not be negative")
	}
	if ov.MinLimit == 0 {
		ov.MinLimit = defaultOverloadMinLimit
	}
	if ov.MaxLimit == 0 {
		ov.MaxLimit = max(defaultOverloadMaxLimit, ov.MinLimit)
	}
	if ov.InitialLimit == 0 {
		ov.InitialLimit = min(max(defaultOverloadInitialLimit, ov.MinLimit), ov.MaxLimit)
	}
	if ov.MaxQueue == 0 {
		ov.MaxQueue = defaultOverloadMaxQueue
	}
	if ov.MaxQueueWait == 0 {
		ov.MaxQueueWait = defaultOverloadMaxQueueWait
	}
	switch {
	case ov.MinLimit > ov.MaxLimit:
		return nil, bad("Overload.MinLimit", ov.MinLimit, fmt.Sprintf("must not exceed MaxLimit (%d)", ov.MaxLimit))
	case ov.InitialLimit < ov.MinLimit || ov.InitialLimit > ov.MaxLimit:
		return nil, bad("Overload.InitialLimit", ov.InitialLimit, fmt.Sprintf("must be between MinLimit (%d) and MaxLimit (%d)", ov.MinLimit, ov.MaxLimit))
	case ov.MaxLimit > 1_000_000:
		return nil, bad("Overload.MaxLimit", ov.MaxLimit, "must be at most 1000000")
	}

	// Timeouts.
	if o.TotalTimeout == 0 {
		o.TotalTimeout = defaultTotalTimeout
	}
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = defaultAttemptTimeout
		if o.TotalTimeout > 0 {
			o.AttemptTimeout = min(o.AttemptTimeout, o.TotalTimeout) // the default yields to a shorter TotalTimeout
		}
	}
	if o.TotalTimeout > 0 && o.AttemptTimeout > o.TotalTimeout {
		return nil, bad("AttemptTimeout", o.AttemptTimeout, fmt.Sprintf("must not exceed TotalTimeout (%v)", o.TotalTimeout))
	}

	// Retry.
	r := &o.Retry
	switch {
	case r.MaxRetries < 0:
		return nil, bad("Retry.MaxRetries", r.MaxRetries, "must not be negative; set Retry.Disabled to turn retries off")
	case r.MaxDelay < 0:
		return nil, bad("Retry.MaxDelay", r.MaxDelay, "must not be negative")
	case r.Backoff < BackoffExponential || r.Backoff > BackoffConstant:
		return nil, bad("Retry.Backoff", r.Backoff, "must be BackoffExponential, BackoffLinear or BackoffConstant")
	case r.MaxRetryAfter < 0:
		return nil, bad("Retry.MaxRetryAfter", r.MaxRetryAfter, "must not be negative; zero means no cap but TotalTimeout")
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
		return nil, bad("Retry.MaxDelay", r.MaxDelay, fmt.Sprintf("must not be below Retry.Delay (%v)", r.Delay))
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = max(defaultMaxRetryDelay, r.Delay)
	}
	hg := &o.Hedging
	switch {
	case hg.MaxHedges < 0 || hg.MaxHedges > 10:
		return nil, bad("Hedging.MaxHedges", hg.MaxHedges, "must be between 1 and 10")
	case hg.Delay < 0:
		return nil, bad("Hedging.Delay", hg.Delay, "must not be negative")
	}
	if hg.MaxHedges == 0 {
		hg.MaxHedges = defaultMaxHedges
	}
	if hg.Delay == 0 {
		hg.Delay = defaultHedgingDelay
	}
	if err := resolveHedgeDelay(hg, bad); err != nil {
		return nil, err
	}
	if err := resolveExtraLoad(hg, bad); err != nil {
		return nil, err
	}
	// One rule for retries, hedges and failover: GET, widened or narrowed
	// by Retry.Methods and Retry.ExcludeMethods.
	methods, err := newMethodSet([]string{http.MethodGet}, r.Methods, r.ExcludeMethods)
	if err != nil {
		return nil, &optionError{handler: o.Name, field: err.field, value: err.value, reason: err.reason}
	}

	// Retry budget.
	rb := &o.RetryBudget
	switch {
	case math.IsNaN(rb.MaxTokens) || rb.MaxTokens < 0 || rb.MaxTokens > 1000 || (rb.MaxTokens > 0 && rb.MaxTokens < 1):
		return nil, bad("RetryBudget.MaxTokens", rb.MaxTokens, "must be in [1, 1000]: a retry needs a whole token")
	case math.IsNaN(rb.RetrySuccessTokens) || rb.RetrySuccessTokens < 0 || rb.RetrySuccessTokens > 1000:
		return nil, bad("RetryBudget.RetrySuccessTokens", rb.RetrySuccessTokens, "must be in (0, 1000]")
	case math.IsNaN(rb.TokenRatio) || rb.TokenRatio < 0 || rb.TokenRatio > 1:
		return nil, bad("RetryBudget.TokenRatio", rb.TokenRatio, "must be in (0, 1]")
	case rb.TokenRatio > 0 && rb.TokenRatio < 0.001:
		return nil, bad("RetryBudget.TokenRatio", rb.TokenRatio, "must be at least 0.001")
	}
	if rb.MaxTokens == 0 {
		rb.MaxTokens = defaultBudgetTokens
	}
	if rb.TokenRatio == 0 {
		rb.TokenRatio = defaultBudgetTokenRatio
	}
	if rb.RetrySuccessTokens == 0 {
		rb.RetrySuccessTokens = defaultBudgetRetrySuccess
	}

	// Circuit breaker.
	cb := &o.CircuitBreaker
	switch {
	case math.IsNaN(cb.FailureRatio) || cb.FailureRatio < 0 || cb.FailureRatio > 1:
		return nil, bad("CircuitBreaker.FailureRatio", cb.FailureRatio, "must be in (0, 1]")
	case cb.MinimumThroughput < 0:
		return nil, bad("CircuitBreaker.MinimumThroughput", cb.MinimumThroughput, "must not be negative")
	case cb.SamplingDuration < 0:
		return nil, bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration, "must not be negative")
	case cb.SamplingDuration > 0 && cb.SamplingDuration < time.Millisecond:
		return nil, bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration, "must be at least 1ms")
	case cb.BreakDuration < 0:
		return nil, bad("CircuitBreaker.BreakDuration", cb.BreakDuration, "must not be negative")
	}
	if cb.FailureRatio == 0 {
		cb.FailureRatio = defaultFailureRatio
	}
	if cb.MinimumThroughput == 0 {
		cb.MinimumThroughput = defaultMinimumThroughput
	}
	if cb.SamplingDuration == 0 {
		cb.SamplingDuration = max(defaultSamplingDuration, 2*o.AttemptTimeout)
	}
	if cb.BreakDuration == 0 {
		cb.BreakDuration = defaultBreakDuration
	}
	if !cb.Disabled && o.AttemptTimeout > 0 && cb.SamplingDuration < 2*o.AttemptTimeout {
		return nil, bad("CircuitBreaker.SamplingDuration", cb.SamplingDuration,
			fmt.Sprintf("must be at least twice AttemptTimeout (%v)", o.AttemptTimeout))
	}

	ph := &o.PerHost
	switch {
	case ph.MaxHosts < 0:
		return nil, bad("PerHost.MaxHosts", ph.MaxHosts, "must not be negative")
	case ph.IdleTimeout < 0:
		return nil, bad("PerHost.IdleTimeout", ph.IdleTimeout, "must not be negative")
	}
	if ph.MaxHosts == 0 {
		ph.MaxHosts = defaultMaxHosts
	}
	if ph.IdleTimeout == 0 {
		ph.IdleTimeout = defaultHostIdleTimeout
	}

	for k := range o.LogLevels {
		if k.String() == "unknown" {
			return nil, bad("LogLevels", int(k), "is not an EventKind")
		}
	}

	if err := resolveFallback(&o.Fallback, bad); err != nil {
		return nil, err
	}
	if err := resolveIdempotency(&o.Idempotency, bad); err != nil {
		return nil, err
	}

	route, rerr := resolveEndpoints(&o, bad)
	if rerr != nil {
		return nil, rerr
	}
	if len(o.Endpoints) > o.PerHost.MaxHosts {
		return nil, bad("PerHost.MaxHosts", o.PerHost.MaxHosts, fmt.Sprintf("must hold every endpoint (%d)", len(o.Endpoints)))
	}

	if o.MaxBufferedBody == 0 {
		o.MaxBufferedBody = defaultMaxBufferedBody
	}
	cfg := &config{Options: o, methods: methods, route: route}
	if o.Logger != nil {
		cfg.logs = newLogSummary(o.Logger, o.Name)
	}
	return cfg, nil
}
