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

// Options configures a [Handler]. The zero value is the standard handler:
// a zero field means the default its comment gives, and a negative value is
// an error that names the field unless the comment gives it a meaning.
// Disabled turns off a layer that is on by default; Enabled turns on one
// that is off. The layers run in this order, outermost first: Fallback,
// RateLimit, TotalTimeout, Retry or Hedging, CircuitBreaker, Overload,
// AttemptTimeout. See docs/defaults.md.
type Options struct {
	// Name names the handler in errors, events and logs. Default "standard".
	Name string

	// RateLimit configures admission control, on by default.
	RateLimit RateLimitOptions

	// Overload configures the overload limiter, on by default.
	Overload OverloadOptions

	// TotalTimeout bounds the whole call, reading the response body included,
	// as http.Client.Timeout does. Default 30s; negative turns it off.
	TotalTimeout time.Duration

	// Retry configures the retry layer, on by default.
	Retry RetryOptions

	// RetryBudget configures the retry budget, on by default.
	RetryBudget RetryBudgetOptions

	// Hedging configures hedging, off by default; it replaces the retry layer.
	Hedging HedgingOptions

	// CircuitBreaker configures the circuit breaker, on by default.
	CircuitBreaker CircuitBreakerOptions

	// AttemptTimeout bounds each attempt until its response headers arrive,
	// at most TotalTimeout. Default 10s, or TotalTimeout if shorter;
	// negative turns it off.
	AttemptTimeout time.Duration

	// PerHost configures per-host isolation, off by default.
	PerHost PerHostOptions

	// MaxBufferedBody is the most of a request body without GetBody that is
	// held to send it again; a larger one is sent once, never retried.
	// Default 1 MiB; negative holds none.
	MaxBufferedBody int64

	// Fallback configures the fallback layer, off by default.
	Fallback FallbackOptions

	// Idempotency, off by default, declares that the upstream keeps the
	// idempotency-key protocol, so that writes are retried like reads.
	Idempotency IdempotencyOptions

	// Logger, when set, receives every Event at the level its kind
	// suggests: retries warn; timeouts, rejections and an opening circuit
	// are errors; the circuit closing or half-opening is info.
	Logger *slog.Logger

	// LogLevels overrides the level Logger gets an event kind at, for
	// instance EventRetry at slog.LevelInfo. EventAttempt and EventCall are
	// logged at slog.LevelDebug unless it says otherwise.
	LogLevels map[EventKind]slog.Level

	// OnEvent, when set, is called synchronously with every Event. It must
	// be safe for concurrent use and should return quickly.
	OnEvent func(Event)
}

// OverloadOptions configures the overload limiter: an adaptive limit on
// the attempts in flight to the upstream (per host with PerHost), from when
// each is sent until its response headers arrive. The limit follows their
// latency, and shrinks on losses that are congestion, not random failures.
// An attempt over it waits for a slot; a call whose first attempt gets none
// fails with [ErrOverloaded], and while the limiter sheds, a retry or hedge
// over it is not sent. See docs/overload.md.
type OverloadOptions struct {
	// Disabled turns the limiter off. Default false.
	Disabled bool

	// MinLimit is the fewest attempts in flight the limit allows. Default 8.
	MinLimit int

	// MaxLimit is the most it allows, at most 1000000. Default 1000.
	MaxLimit int

	// InitialLimit is where the limit starts, within [MinLimit, MaxLimit].
	// Default 20.
	InitialLimit int

	// MaxQueue is how many attempts may wait for a slot. Default 1000.
	MaxQueue int

	// MaxQueueWait is the longest an attempt waits for a slot, never past
	// the call's deadline. Default 1s.
	MaxQueueWait time.Duration
}

// Defaults of OverloadOptions.
const (
	defaultOverloadMinLimit     = 8
	defaultOverloadMaxLimit     = 1000
	defaultOverloadInitialLimit = 20
	defaultOverloadMaxQueue     = 1000
	defaultOverloadMaxQueueWait = time.Second
)

// RateLimitOptions configures admission control: a limit on the calls in
// flight, an optional rate, and pacing by the quota the upstream announces.
// A call refused fails with [ErrRateLimited]; when a rate refused it, the
// cause is a [*RateLimitError]. A call holds its permit until its response
// body is closed or read to EOF, or its total timeout ends it.
type RateLimitOptions struct {
	// Disabled turns admission control off, pacing by the server's quota
	// included. Default false.
	Disabled bool

	// MaxConcurrent is the most calls in flight. Default 1000.
	MaxConcurrent int

	// MaxQueue is how many calls may wait for a permit when MaxConcurrent
	// are in flight; the wait counts against TotalTimeout. Default 0: none.
	MaxQueue int

	// RequestsPerSecond, if positive, limits the rate at which calls start,
	// from 0.001 to 1e9. Default 0: no rate.
	RequestsPerSecond float64

	// Burst is how many calls may start at once within the rate, at most
	// 1000000; it needs RequestsPerSecond. Default 0: calls spaced evenly.
	Burst int

	// Wait makes a call over a rate wait for its permit, if it is due
	// before the call's deadline, instead of failing at once. A waiting
	// call holds its concurrency permit. Default false.
	Wait bool

	// Shared, if set, is a rate shared with other processes, such as a
	// redislimit.Limiter; see [SharedRate]. A configuration file cannot
	// set it. Default nil: none.
	Shared SharedRate

	// IgnoreServerQuota stops the pacing of calls by the quota the upstream
	// announces (RateLimit or X-RateLimit-* fields, and a 429 with them and
	// Retry-After). Default false: calls past the quota wait for its reset
	// or fail at once, as Wait says. See docs/server-pacing.md.
	IgnoreServerQuota bool

	// PauseOn429 makes any 429 with Retry-After hold back every call (of
	// its host, with PerHost) until then, as one with quota fields does.
	// Default false: a 429 without them may be one request's.
	PauseOn429 bool
}

// PerHostOptions configures per-host isolation: every authority
// (scheme://host:port) gets its own circuit breaker, admission control and
// overload limiter. See docs/per-host.md.
type PerHostOptions struct {
	// Enabled turns per-host isolation on; Handler.Update cannot change it.
	// Default false: one circuit and one set of limits for every call.
	Enabled bool

	// MaxHosts is how many hosts are kept; meeting one more forgets the
	// least recently used idle one. A host with a call in flight or an
	// open circuit is never forgotten. Default 1000.
	MaxHosts int

	// IdleTimeout is how long a host stays idle, from the end of its last
	// call, before it is forgotten with its circuit and counts. Default 5m.
	IdleTimeout time.Duration
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

// RetryOptions configures the retry layer. It retries the transient
// failures ([IsTransient], or ShouldRetry) of the requests that are safe to
// repeat: by default GET, as Methods and ExcludeMethods say. A retry waits
// for a delay, or for the Retry-After of a 429 or 503, unless the wait
// would end past the call's deadline: then the caller gets the failed
// attempt's outcome at once. See docs/retries.md.
type RetryOptions struct {
	// Disabled turns retries off. Default false.
	Disabled bool

	// MaxRetries is how many times a call may be repeated after its first
	// attempt. Default 3.
	MaxRetries int

	// Delay is the base delay between attempts. Default 2s, or MaxDelay if
	// shorter; negative means none: retries go at once, whatever Backoff
	// and MaxDelay say (a Retry-After is still honoured).
	Delay time.Duration

	// MaxDelay caps the computed delay, not a Retry-After nor what
	// DelayFunc returns; it must not be below Delay. Default 30s, or Delay
	// if longer.
	MaxDelay time.Duration

	// Backoff says how the delay grows. Default BackoffExponential.
	Backoff BackoffType

	// NoJitter turns off the randomisation of delays by ±50%. Default false.
	NoJitter bool

	// Methods adds methods to the set retried, which holds GET by default.
	// The set holds for every outcome, errors and timeouts included;
	// WithRetryable overrides it for one request.
	Methods []string

	// ExcludeMethods removes methods from the set, GET included, after
	// Methods. Default none.
	ExcludeMethods []string

	// IgnoreRetryAfter makes the retry layer ignore the Retry-After of 429
	// and 503 responses and wait the computed delay. Default false.
	IgnoreRetryAfter bool

	// MaxRetryAfter is the longest Retry-After waited; after a longer one
	// the caller gets the response at once. Default 0: no cap but the call's
	// deadline.
	MaxRetryAfter time.Duration

	// ShouldRetry, if set, replaces [IsTransient] in deciding which outcomes
	// are retried, and with hedging which do not win; the method rule, the
	// caller's context, the total timeout and the request's own failures
	// still apply first. It must be safe for concurrent use, and must not
	// modify or keep the request nor read or close the response body.
	// Default nil: IsTransient.
	ShouldRetry func(req *http.Request, resp *http.Response, err error) bool

	// DelayFunc, if set, returns the delay before each retry, given a
	// [DelayInfo]: zero retries at once, a negative value keeps the computed
	// delay, and MaxDelay does not cap it. A Retry-After honoured wins over
	// it; hedging does not use it. It is called from many calls at once: it
	// must be safe for concurrent use and return quickly. Default nil: the
	// computed delay.
	DelayFunc func(DelayInfo) time.Duration
}

// HedgingOptions configures hedging, which replaces the retry layer when
// enabled: while no attempt has an acceptable outcome, another follows after
// Delay, up to MaxHedges more, and the first acceptable outcome wins. A
// handled failure (one Retry.ShouldRetry or IsTransient would retry) sends
// the next at once. Only requests the retry layer's method rule allows are
// hedged. Each hedge needs a closed circuit; one that follows a failure is a
// retry, and needs the retry budget. See docs/hedging.md.
type HedgingOptions struct {
	// Enabled turns hedging on, and the retry layer off. Default false;
	// NewHedgingTransport sets it.
	Enabled bool

	// MaxHedges is how many attempts may be sent besides the first, at most
	// 10. Default 1.
	MaxHedges int

	// Delay is how long an attempt runs before the next is sent, and with
	// DelayPercentile, the delay until 100 attempts are seen. Default 2s.
	Delay time.Duration

	// DelayPercentile, in (0, 1), makes the delay adaptive: the attempts
	// slower than this percentile of those of the last 5 to 10 seconds are
	// hedged, within [MinDelay, MaxDelay]. Default 0: the fixed Delay.
	DelayPercentile float64

	// MinDelay is the shortest adaptive delay. Default 1ms, or MaxDelay if
	// shorter.
	MinDelay time.Duration

	// MaxDelay is the longest adaptive delay, at least MinDelay. Default
	// Delay.
	MaxDelay time.Duration

	// MaxExtraLoad caps the hedges sent while an attempt still runs, in
	// (0, 10]: at most this share of the calls of the last 10 seconds, plus
	// one. A hedge refused is an EventHedgeCapped. Default 0.05;
	// NoExtraLoadCap for no cap.
	MaxExtraLoad float64

	// Endpoints, if set, spread a call's attempts over these base URLs
	// instead of the request's: each hedge, or each retry without hedging,
	// goes to another, as Routing says. Each endpoint has a circuit breaker
	// of its own, so PerHost.Enabled is required. At most 16. Default nil:
	// none; an empty non-nil list is an error.
	Endpoints []Endpoint

	// Routing says how attempts are spread over Endpoints. Default
	// RouteOrdered.
	Routing Routing
}

// RetryBudgetOptions configures the retry budget, shared by all the calls
// of a handler (all its hosts, with PerHost). It is a bucket of MaxTokens
// tokens, full at first. A retry, or a hedge that follows a failure, is
// made only while a token is left that no retry in flight has claimed; one
// that fails takes its token, one that succeeds puts back
// RetrySuccessTokens, and a first attempt that succeeds puts back
// TokenRatio. A call refused a retry ends on its last outcome, with an
// EventBudgetExceeded. See docs/retries.md.
type RetryBudgetOptions struct {
	// Disabled turns the budget off: every retry the retry layer allows is
	// made. Default false.
	Disabled bool

	// MaxTokens is the bucket's size, in [1, 1000]: how many failing retries
	// in a row an upstream that fails every attempt gets. Default 25.
	MaxTokens float64

	// TokenRatio is the share of a token that a first attempt that succeeds
	// puts back, in [0.001, 1]. Default 0.2.
	TokenRatio float64

	// RetrySuccessTokens is how many tokens a retry that succeeds puts back,
	// in (0, 1000]. Default 6: retries go on while one in seven succeeds.
	RetrySuccessTokens float64
}

// CircuitBreakerOptions configures the circuit breaker. It counts attempts,
// not calls: the circuit opens when at least MinimumThroughput attempts in
// the last SamplingDuration include FailureRatio failures, and rejects calls
// with [ErrCircuitOpen] until BreakDuration has passed and one probe has
// succeeded. See docs/circuit-breaker.md.
type CircuitBreakerOptions struct {
	// Disabled turns the circuit breaker off; Handler.IsolateCircuit still
	// works. Default false.
	Disabled bool

	// FailureRatio is the share of failed attempts that opens the circuit,
	// in (0, 1]. Default 0.9.
	FailureRatio float64

	// MinimumThroughput is how many attempts the window must hold before
	// the ratio counts. Default 100.
	MinimumThroughput int

	// SamplingDuration is the sliding window attempts are counted in, at
	// least 1ms and twice AttemptTimeout. Default 30s, or twice
	// AttemptTimeout if longer.
	SamplingDuration time.Duration

	// BreakDuration is how long the circuit stays open before it lets one
	// probe through. Default 1s.
	BreakDuration time.Duration

	// ShouldHandle, if set, replaces IsTransient in deciding which attempt
	// outcomes are failures; caller cancellation and the total timeout are
	// never counted. Default nil: IsTransient.
	ShouldHandle func(*http.Response, error) bool
}

// config is Options with defaults filled in and validated.
type config struct {
	Options
	methods methodSet
	route   *router // Hedging.Endpoints resolved; nil without
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

	route, rerr := resolveEndpoints(&o.Hedging, o.PerHost.Enabled, bad)
	if rerr != nil {
		return nil, rerr
	}

	if o.MaxBufferedBody == 0 {
		o.MaxBufferedBody = defaultMaxBufferedBody
	}
	return &config{Options: o, methods: methods, route: route}, nil
}
