package resilience

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"
)

// Defaults of Options: what a zero field means.
const (
	defaultName            = "standard"
	defaultTotalTimeout    = 30 * time.Second
	defaultAttemptTimeout  = 10 * time.Second
	defaultMaxBufferedBody = 1 << 20
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
	// http.Client.Timeout does. Default 30s, or 3 × an explicit
	// AttemptTimeout if longer; negative turns it off.
	TotalTimeout time.Duration

	Retry          RetryOptions          // the retry layer, on by default
	RetryBudget    RetryBudgetOptions    // the retry budget, on by default
	Hedging        HedgingOptions        // off by default; replaces Retry
	CircuitBreaker CircuitBreakerOptions // the circuit breaker, on by default

	// AttemptTimeout bounds each attempt until its response headers arrive,
	// at most TotalTimeout. One past it is cut, to be retried, once an
	// attempt sent a quarter of it later is answered; until then it is
	// queued upstream and waits on (docs/overload.md). Default 10s, or an
	// explicit TotalTimeout or half an explicit
	// CircuitBreaker.SamplingDuration if shorter; negative turns it off.
	AttemptTimeout       time.Duration
	StrictAttemptTimeout bool // cut every attempt at AttemptTimeout, as Polly does; default false

	PerHost     PerHostOptions     // per-host isolation, off by default
	Propagation PropagationOptions // the budget sent with each attempt, off by default

	// Endpoints, if set, are the base URLs of the attempts: retries and
	// hedges go to the next as Routing says, and each has a circuit breaker
	// and an overload limit of its own. A retry to an endpoint the call has
	// not tried, after a connection failure, goes at once. At most 16, none
	// by default; an empty, non-nil list is an error.
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

// config is Options with defaults filled in and validated.
type config struct {
	Options
	given   Options // as written: a zero field is a default (Handler.Update, WithAttemptTimeout)
	methods methodSet
	route   *router     // Endpoints resolved; nil without
	logs    *logSummary // the counts of Logger's summarised kinds; nil without Logger
	// observed is whether the options have observers (OnEvent or Logger):
	// without, a call builds no event at all (event.go).
	observed bool
}

// resolve fills in defaults and validates o, layer by layer: each layer's
// options are resolved beside it (resolveRateLimit in ratelimitoptions.go,
// and so on), and what spans layers is resolved here.
func resolve(o Options) (*config, error) {
	given := o
	if o.Name == "" {
		o.Name = defaultName
	}
	bad := func(field string, value any, reason string) error {
		return &optionError{handler: o.Name, field: field, value: value, reason: reason}
	}
	if err := resolveRateLimit(&o.RateLimit, bad); err != nil {
		return nil, err
	}
	if err := resolveOverload(&o.Overload, bad); err != nil {
		return nil, err
	}

	resolveTimeouts(&o)
	if o.TotalTimeout > 0 && o.AttemptTimeout > o.TotalTimeout { // both explicit: a default yields
		return nil, bad("AttemptTimeout", o.AttemptTimeout, fmt.Sprintf("must not exceed TotalTimeout (%v)", o.TotalTimeout))
	}

	if err := resolveRetry(&o.Retry, bad); err != nil {
		return nil, err
	}
	if err := resolveHedging(&o.Hedging, bad); err != nil {
		return nil, err
	}
	// One rule for retries, hedges and failover: GET, widened or narrowed
	// by Retry.Methods and Retry.ExcludeMethods.
	methods, err := newMethodSet([]string{http.MethodGet}, o.Retry.Methods, o.Retry.ExcludeMethods)
	if err != nil {
		return nil, &optionError{handler: o.Name, field: err.field, value: err.value, reason: err.reason}
	}
	if err := resolveRetryBudget(&o.RetryBudget, bad); err != nil {
		return nil, err
	}
	if err := resolveCircuitBreaker(&o.CircuitBreaker, o.AttemptTimeout, bad); err != nil {
		return nil, err
	}
	if err := resolvePerHost(&o.PerHost, bad); err != nil {
		return nil, err
	}
	if err := resolvePropagation(&o.Propagation, bad); err != nil {
		return nil, err
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

	route, rerr := resolveEndpoints(o.Endpoints, o.Routing, bad)
	if rerr != nil {
		return nil, rerr
	}
	if len(o.Endpoints) > o.PerHost.MaxHosts {
		return nil, bad("PerHost.MaxHosts", o.PerHost.MaxHosts, fmt.Sprintf("must hold every endpoint (%d)", len(o.Endpoints)))
	}

	if o.MaxBufferedBody == 0 {
		o.MaxBufferedBody = defaultMaxBufferedBody
	}
	cfg := &config{Options: o, given: given, methods: methods, route: route, observed: o.OnEvent != nil || o.Logger != nil}
	if o.Logger != nil {
		cfg.logs = newLogSummary(o.Logger, o.Name)
	}
	return cfg, nil
}

// totalPerAttempt is how many attempt timeouts the default TotalTimeout
// holds at least: as many as the defaults' (30s for 10s).
const totalPerAttempt = defaultTotalTimeout / defaultAttemptTimeout

// resolveTimeouts fills in the default attempt and total timeouts, each
// yielding to the explicit values it would contradict. The attempt timeout
// is 10s, or less to fit an explicit TotalTimeout, or half an explicit
// CircuitBreaker.SamplingDuration, which must hold two. The total timeout
// is 30s, or three explicit attempt timeouts if that is longer: an
// explicit AttemptTimeout of 40s gets a total of 2m, time for the slow
// attempts the defaults allow (three), not one.
func resolveTimeouts(o *Options) {
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = defaultAttemptTimeout
		if o.TotalTimeout > 0 {
			o.AttemptTimeout = min(o.AttemptTimeout, o.TotalTimeout)
		}
		if cb := o.CircuitBreaker; !cb.Disabled && cb.SamplingDuration >= time.Millisecond {
			o.AttemptTimeout = min(o.AttemptTimeout, cb.SamplingDuration/2)
		}
	}
	if o.TotalTimeout == 0 {
		o.TotalTimeout = defaultTotalTimeout
		if o.AttemptTimeout > 0 {
			o.TotalTimeout = max(o.TotalTimeout, scaled(o.AttemptTimeout, totalPerAttempt))
		}
	}
}

// scaled returns n times d, n > 0, saturated at the longest Duration
// rather than overflowed.
func scaled(d time.Duration, n time.Duration) time.Duration {
	if d > math.MaxInt64/n {
		return math.MaxInt64
	}
	return d * n
}

var optionFields = fieldSet[Options]{
	"totalTimeout": durationField(func(o *Options) *time.Duration { return &o.TotalTimeout },
		keepZero),
	"attemptTimeout": durationField(func(o *Options) *time.Duration { return &o.AttemptTimeout },
		keepZero),
	"strictAttemptTimeout": boolField(func(o *Options) *bool { return &o.StrictAttemptTimeout }),
	"maxBufferedBody": intField(func(o *Options) *int64 { return &o.MaxBufferedBody },
		keepZero),
	"rateLimit":      objectField(rateLimitFields, func(o *Options) *RateLimitOptions { return &o.RateLimit }),
	"overload":       objectField(overloadFields, func(o *Options) *OverloadOptions { return &o.Overload }),
	"retry":          objectField(retryFields, func(o *Options) *RetryOptions { return &o.Retry }),
	"circuitBreaker": objectField(circuitBreakerFields, func(o *Options) *CircuitBreakerOptions { return &o.CircuitBreaker }),
	"perHost":        objectField(perHostFields, func(o *Options) *PerHostOptions { return &o.PerHost }),
	"propagation":    objectField(propagationFields, func(o *Options) *PropagationOptions { return &o.Propagation }),
	"retryBudget":    objectField(retryBudgetFields, func(o *Options) *RetryBudgetOptions { return &o.RetryBudget }),
	"hedging":        objectField(hedgingFields, func(o *Options) *HedgingOptions { return &o.Hedging }),
	"endpoints":      endpointsField,
	"routing":        routingField,
	"fallback":       objectField(fallbackFields, func(o *Options) *FallbackOptions { return &o.Fallback }),
	"logLevels":      logLevelsField,
	"idempotency":    objectField(idempotencyFields, func(o *Options) *IdempotencyOptions { return &o.Idempotency }),
}

func logLevelsField(o *Options, raw json.RawMessage, path string) error {
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return configErr(path, "want an object of event kinds to levels, such as {\"retry\": \"INFO\"}, got %s", brief(raw))
	}
	if o.LogLevels == nil {
		o.LogLevels = make(map[EventKind]slog.Level, len(m))
	}
	for _, name := range sortedKeys(m) {
		var k EventKind
		if err := k.UnmarshalText([]byte(name)); err != nil {
			return configErr(path+"."+name, "unknown event kind")
		}
		var l slog.Level
		if err := l.UnmarshalText([]byte(m[name])); err != nil {
			return configErr(path+"."+name, "invalid level %q (want DEBUG, INFO, WARN or ERROR)", m[name])
		}
		o.LogLevels[k] = l
	}
	return nil
}
