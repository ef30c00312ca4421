package resilience

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Config is a set of named upstreams, each with the Options of its handler,
// as read by LoadConfig.
type Config struct {
	Upstreams map[string]Options
}

// LoadConfig reads a JSON configuration of named upstreams:
//
//	{
//	  "defaults":  { ...options every upstream starts from... },
//	  "upstreams": {
//	    "pricing": { "attemptTimeout": "2s", "retry": { "delay": "200ms" } },
//	    "carrier": { "circuitBreaker": { "minimumThroughput": 10 } }
//	  }
//	}
//
// Every Options field that is data can be set, under its name in lower
// camel case; durations are Go duration strings ("250ms"), Backoff is
// "exponential", "linear" or "constant", LogLevels maps event kinds
// ("retry") to slog levels ("INFO"). An upstream's fields override the
// defaults' one by one. Unknown keys, values of the wrong type, bad
// durations and invalid combinations are errors that name the upstream
// and the field, such as
//
//	resilience: config: upstreams.pricing.retry.delay: invalid duration "2x"
//
// Every upstream is validated as NewHandler would; Config.Handlers builds
// them.
//
// A zero written in the file is meant, never read as "the default": omit a
// field for its default. Where Options can say what the zero says, it is
// honoured: retry.maxRetries 0 turns retries off, as retry.disabled does;
// retry.delay "0s" retries at once, with no delay (a negative Retry.Delay);
// circuitBreaker.minimumThroughput 0 judges the failure ratio from the first
// attempt (it becomes 1); rateLimit.maxQueue, rateLimit.requestsPerSecond,
// rateLimit.burst and retry.maxRetryAfter keep their zero, which is their
// default (no queue, no rate limit, no burst, no cap);
// hedging.delayPercentile 0 is the fixed delay, its default; and
// hedging.maxExtraLoad 0 is no cap on hedging's extra load (NoExtraLoadCap).
// hedging.endpoints is a list of {"url": ..., "weight": ...} and
// hedging.routing is "ordered" or "weighted". Every other zero is an
// error where it is written, in an upstream or in the defaults, that says how
// to write what was probably meant, such as
//
//	resilience: config: upstreams.pricing.totalTimeout: "0s" is not allowed here; omit the field for the default (30s) or write a negative duration such as "-1s" to disable the total timeout
//
// The input is one JSON object of at most 1 MiB; anything after the object
// but white space is an error.
func LoadConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("resilience: config: %w", err)
	}
	if len(data) > maxConfigSize {
		return Config{}, configErr("", "the configuration is larger than 1 MiB (%d bytes), the most LoadConfig reads", maxConfigSize)
	}
	var top map[string]json.RawMessage
	if err := strictUnmarshal(data, &top); err != nil {
		return Config{}, configErr("", "%s", jsonProblem(err))
	}
	for key := range top {
		if key != "defaults" && key != "upstreams" {
			return Config{}, configErr(key, "unknown field (known: defaults, upstreams)")
		}
	}
	var upstreams map[string]json.RawMessage
	if raw, ok := top["upstreams"]; ok {
		if err := strictUnmarshal(raw, &upstreams); err != nil || upstreams == nil {
			return Config{}, configErr("upstreams", "want an object of named upstreams")
		}
	}
	if len(upstreams) == 0 {
		return Config{}, configErr("upstreams", "no upstream is configured")
	}
	cfg := Config{Upstreams: make(map[string]Options, len(upstreams))}
	for _, name := range sortedKeys(upstreams) {
		path := "upstreams." + name
		if name == "" {
			return Config{}, configErr(path, "an upstream needs a name")
		}
		var f fileOptions
		if raw, ok := top["defaults"]; ok {
			if err := optionFields.decode(&f, raw, "defaults"); err != nil {
				return Config{}, err
			}
		}
		if err := optionFields.decode(&f, upstreams[name], path); err != nil {
			return Config{}, err
		}
		o := f.Options
		if f.noRetries {
			o.Retry.Disabled = true
		}
		o.Name = name
		if _, err := resolve(o); err != nil {
			var oe *optionError
			if errors.As(err, &oe) {
				reason := goField.ReplaceAllStringFunc(oe.reason, jsonPath)
				return Config{}, configErr(fmt.Sprintf("%s.%s (%v)", path, jsonPath(oe.field), oe.value), "%s", reason)
			}
			return Config{}, configErr(path, "%v", err)
		}
		cfg.Upstreams[name] = o
	}
	return cfg, nil
}

// maxConfigSize is the most LoadConfig reads: a configuration of named
// upstreams is a few KiB, and a larger input is a mistake, not a file.
const maxConfigSize = 1 << 20

// fileOptions is the Options a file builds, layer by layer: the defaults,
// then the upstream.
type fileOptions struct {
	Options

	// noRetries is set when the last layer to write retry.maxRetries wrote
	// 0, which means no retries: Retry.Disabled once every layer is read.
	// An upstream's maxRetries 2 thus overrides the defaults' 0.
	noRetries bool
}

func configErr(path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	return errors.New("resilience: config: " + msg)
}

// goField matches an Options field path in a validation message.
var goField = regexp.MustCompile(`\b[A-Z][a-z][A-Za-z]*(\.[A-Z][a-z][A-Za-z]*)*\b`)

// jsonPath turns an Options field path ("Retry.Methods[0]") into its name
// in the configuration ("retry.methods[0]").
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	for i, p := range parts {
		switch {
		case p == "URL":
			parts[i] = "url" // an initialism, lower case in full
		case p != "":
			parts[i] = strings.ToLower(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, ".")
}

var errTrailingData = errors.New("unexpected data after the JSON object")

// strictUnmarshal decodes the one JSON value data holds. Anything after it
// but JSON white space is an error, a stray "}" or "]" included (which
// json.Decoder.More does not report).
func strictUnmarshal(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if rest := bytes.TrimLeft(data[d.InputOffset():], " \t\r\n"); len(rest) > 0 {
		// Counted from 1, as json.SyntaxError's offsets are.
		return fmt.Errorf("%w at byte %d: %q", errTrailingData, len(data)-len(rest)+1, rest[:min(len(rest), 16)])
	}
	return nil
}

func jsonProblem(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("invalid JSON at byte %d: %v", syn.Offset, err)
	}
	if errors.Is(err, io.EOF) {
		return "empty configuration"
	}
	if errors.Is(err, errTrailingData) {
		return err.Error()
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "invalid JSON: it ends too early"
	}
	return "the configuration must be a JSON object"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// A fieldSet decodes one JSON object into T, field by field, so that every
// error can name the field's path.
type fieldSet[T any] map[string]func(v *T, raw json.RawMessage, path string) error

func (fs fieldSet[T]) decode(v *T, raw json.RawMessage, path string) error {
	var obj map[string]json.RawMessage
	if err := strictUnmarshal(raw, &obj); err != nil || obj == nil {
		return configErr(path, "want an object, got %s", brief(raw))
	}
	for _, key := range sortedKeys(obj) {
		set, ok := fs[key]
		if !ok {
			return configErr(path+"."+key, "unknown field (known: %s)", strings.Join(sortedKeys(fs), ", "))
		}
		if err := set(v, obj[key], path+"."+key); err != nil {
			return err
		}
	}
	return nil
}

func brief(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

// Setters for one field of a given type.

// A zeroRule says what a zero written in a file means for a numeric field.
// In Options a zero field takes its default, but in a file a written zero is
// a deliberate value: either the field's default is zero anyway (keepZero),
// or the zero is rejected with a hint saying how to write what was probably
// meant (rejectZero). Fields whose zero means something else (maxRetries,
// retry.delay, minimumThroughput) keep it and translate it in their own
// setters.
type zeroRule struct {
	def string // the field's default, as the error names it; empty: keep the zero
	or  string // another way to say what the zero probably meant, if any
}

var keepZero = zeroRule{}

func rejectZero(def any, or string) zeroRule {
	return zeroRule{def: fmt.Sprint(def), or: or}
}

func (z zeroRule) check(path string, raw json.RawMessage) error {
	if z.def == "" {
		return nil
	}
	msg := fmt.Sprintf("%s is not allowed here; omit the field for the default (%s)", brief(raw), z.def)
	if z.or != "" {
		msg += " or " + z.or
	}
	return configErr(path, "%s", msg)
}

func durationField[T any](field func(*T) *time.Duration, zero zeroRule) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return configErr(path, "want a duration string such as \"250ms\", got %s", brief(raw))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return configErr(path, "invalid duration %q", s)
		}
		if d == 0 {
			if err := zero.check(path, raw); err != nil {
				return err
			}
		}
		*field(v) = d
		return nil
	}
}

func intField[T any, N int | int64](field func(*T) *N, zero zeroRule) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil || raw[0] == '"' {
			return configErr(path, "want an integer, got %s", brief(raw))
		}
		i, err := n.Int64()
		if err != nil || int64(N(i)) != i {
			return configErr(path, "want an integer, got %s", brief(raw))
		}
		if i == 0 {
			if err := zero.check(path, raw); err != nil {
				return err
			}
		}
		*field(v) = N(i)
		return nil
	}
}

func floatField[T any](field func(*T) *float64, zero zeroRule) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil || raw[0] == '"' {
			return configErr(path, "want a number, got %s", brief(raw))
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) {
			return configErr(path, "want a number, got %s", brief(raw))
		}
		if f == 0 {
			if err := zero.check(path, raw); err != nil {
				return err
			}
			f = 0 // not -0
		}
		*field(v) = f
		return nil
	}
}

func boolField[T any](field func(*T) *bool) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		if err := json.Unmarshal(raw, field(v)); err != nil {
			return configErr(path, "want true or false, got %s", brief(raw))
		}
		return nil
	}
}

func stringsField[T any](field func(*T) *[]string) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return configErr(path, "want a list of strings, got %s", brief(raw))
		}
		*field(v) = ss
		return nil
	}
}

func objectField[T, F any](fs fieldSet[F], field func(*T) *F) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		return fs.decode(field(v), raw, path)
	}
}

var overloadFields = fieldSet[OverloadOptions]{
	"disabled": boolField(func(o *OverloadOptions) *bool { return &o.Disabled }),
	"minLimit": intField(func(o *OverloadOptions) *int { return &o.MinLimit },
		rejectZero(defaultOverloadMinLimit, "")),
	"maxLimit": intField(func(o *OverloadOptions) *int { return &o.MaxLimit },
		rejectZero(defaultOverloadMaxLimit, "")),
	"initialLimit": intField(func(o *OverloadOptions) *int { return &o.InitialLimit },
		rejectZero(defaultOverloadInitialLimit, "")),
	"maxQueue": intField(func(o *OverloadOptions) *int { return &o.MaxQueue },
		rejectZero(defaultOverloadMaxQueue, "")),
	"maxQueueWait": durationField(func(o *OverloadOptions) *time.Duration { return &o.MaxQueueWait },
		rejectZero(defaultOverloadMaxQueueWait, "")),
}

var rateLimitFields = fieldSet[RateLimitOptions]{
	"disabled": boolField(func(o *RateLimitOptions) *bool { return &o.Disabled }),
	"maxConcurrent": intField(func(o *RateLimitOptions) *int { return &o.MaxConcurrent },
		rejectZero(defaultMaxConcurrent, "set rateLimit.disabled to turn admission control off")),
	"maxQueue":          intField(func(o *RateLimitOptions) *int { return &o.MaxQueue }, keepZero),
	"requestsPerSecond": floatField(func(o *RateLimitOptions) *float64 { return &o.RequestsPerSecond }, keepZero),
	"burst":             intField(func(o *RateLimitOptions) *int { return &o.Burst }, keepZero),
	"wait":              boolField(func(o *RateLimitOptions) *bool { return &o.Wait }),
	"ignoreServerQuota": boolField(func(o *RateLimitOptions) *bool { return &o.IgnoreServerQuota }),
	"pauseOn429":        boolField(func(o *RateLimitOptions) *bool { return &o.PauseOn429 }),
}

// retryFields decode into the whole fileOptions, for maxRetries' sake.
var retryFields = fieldSet[fileOptions]{
	"disabled":   boolField(func(o *fileOptions) *bool { return &o.Retry.Disabled }),
	"maxRetries": maxRetriesField,
	"delay":      retryDelayField,
	"maxDelay": durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxDelay },
		rejectZero(fmt.Sprintf("%v, or retry.delay when that is longer", defaultMaxRetryDelay), "")),
	"backoff":          backoffField,
	"noJitter":         boolField(func(o *fileOptions) *bool { return &o.Retry.NoJitter }),
	"methods":          stringsField(func(o *fileOptions) *[]string { return &o.Retry.Methods }),
	"excludeMethods":   stringsField(func(o *fileOptions) *[]string { return &o.Retry.ExcludeMethods }),
	"ignoreRetryAfter": boolField(func(o *fileOptions) *bool { return &o.Retry.IgnoreRetryAfter }),
	"maxRetryAfter":    durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxRetryAfter }, keepZero),
}

// maxRetriesField reads retry.maxRetries, where a written 0 means no retries.
func maxRetriesField(o *fileOptions, raw json.RawMessage, path string) error {
	if err := intField(func(o *fileOptions) *int { return &o.Retry.MaxRetries }, keepZero)(o, raw, path); err != nil {
		return err
	}
	o.noRetries = o.Retry.MaxRetries == 0
	return nil
}

// retryDelayField reads retry.delay, where a written 0 means no delay:
// retries go at once, as a negative Delay says in Options.
func retryDelayField(o *fileOptions, raw json.RawMessage, path string) error {
	if err := durationField(func(o *fileOptions) *time.Duration { return &o.Retry.Delay }, keepZero)(o, raw, path); err != nil {
		return err
	}
	if o.Retry.Delay == 0 {
		o.Retry.Delay = -1
	}
	return nil
}

func backoffField(o *fileOptions, raw json.RawMessage, path string) error {
	var s string
	_ = json.Unmarshal(raw, &s)
	for _, b := range []BackoffType{BackoffExponential, BackoffLinear, BackoffConstant} {
		if s == b.String() {
			o.Retry.Backoff = b
			return nil
		}
	}
	return configErr(path, "want \"exponential\", \"linear\" or \"constant\", got %s", brief(raw))
}

var circuitBreakerFields = fieldSet[CircuitBreakerOptions]{
	"disabled": boolField(func(o *CircuitBreakerOptions) *bool { return &o.Disabled }),
	"failureRatio": floatField(func(o *CircuitBreakerOptions) *float64 { return &o.FailureRatio },
		rejectZero(defaultFailureRatio, "set circuitBreaker.disabled to turn the circuit breaker off")),
	"minimumThroughput": minimumThroughputField,
	"samplingDuration": durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.SamplingDuration },
		rejectZero(fmt.Sprintf("%v, or twice attemptTimeout when that is longer", defaultSamplingDuration), "")),
	"breakDuration": durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.BreakDuration },
		rejectZero(defaultBreakDuration, "set circuitBreaker.disabled to turn the circuit breaker off")),
}

// minimumThroughputField reads circuitBreaker.minimumThroughput, where a
// written 0 means no minimum: the ratio counts from the first attempt, as 1
// says in Options.
func minimumThroughputField(o *CircuitBreakerOptions, raw json.RawMessage, path string) error {
	if err := intField(func(o *CircuitBreakerOptions) *int { return &o.MinimumThroughput }, keepZero)(o, raw, path); err != nil {
		return err
	}
	if o.MinimumThroughput == 0 {
		o.MinimumThroughput = 1
	}
	return nil
}

var retryBudgetFields = fieldSet[RetryBudgetOptions]{
	"disabled": boolField(func(o *RetryBudgetOptions) *bool { return &o.Disabled }),
	"maxTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.MaxTokens },
		rejectZero(defaultBudgetTokens, "set retryBudget.disabled to turn the retry budget off")),
	"tokenRatio": floatField(func(o *RetryBudgetOptions) *float64 { return &o.TokenRatio },
		rejectZero(defaultBudgetTokenRatio, "set retryBudget.disabled to turn the retry budget off")),
	"retrySuccessTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.RetrySuccessTokens },
		rejectZero(defaultBudgetRetrySuccess, "set retryBudget.disabled to turn the retry budget off")),
}

var hedgingFields = fieldSet[HedgingOptions]{
	"enabled": boolField(func(o *HedgingOptions) *bool { return &o.Enabled }),
	"maxHedges": intField(func(o *HedgingOptions) *int { return &o.MaxHedges },
		rejectZero(defaultMaxHedges, "leave hedging.enabled false to send no hedges")),
	"delay": durationField(func(o *HedgingOptions) *time.Duration { return &o.Delay },
		rejectZero(defaultHedgingDelay, `write a short duration such as "10ms" to hedge sooner`)),
	"delayPercentile": floatField(func(o *HedgingOptions) *float64 { return &o.DelayPercentile }, keepZero),
	"minDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MinDelay },
		rejectZero(defaultHedgingMinDelay, "")),
	"maxDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MaxDelay },
		rejectZero("hedging.delay", "")),
	"maxExtraLoad": maxExtraLoadField,
	"routing":      routingField,
	"endpoints":    endpointsField,
}

// maxExtraLoadField reads hedging.maxExtraLoad, where a written 0 means no
// cap, as NoExtraLoadCap says in Options.
func maxExtraLoadField(o *HedgingOptions, raw json.RawMessage, path string) error {
	if err := floatField(func(o *HedgingOptions) *float64 { return &o.MaxExtraLoad }, keepZero)(o, raw, path); err != nil {
		return err
	}
	if o.MaxExtraLoad == 0 {
		o.MaxExtraLoad = NoExtraLoadCap
	}
	return nil
}

func routingField(o *HedgingOptions, raw json.RawMessage, path string) error {
	var s string
	_ = json.Unmarshal(raw, &s)
	for _, r := range []Routing{RouteOrdered, RouteWeighted} {
		if s == r.String() {
			o.Routing = r
			return nil
		}
	}
	return configErr(path, "want \"ordered\" or \"weighted\", got %s", brief(raw))
}

var endpointFields = fieldSet[Endpoint]{
	"url": func(e *Endpoint, raw json.RawMessage, path string) error {
		if err := json.Unmarshal(raw, &e.URL); err != nil {
			return configErr(path, "want a base URL such as \"https://eu.orders.internal/api\", got %s", brief(raw))
		}
		return nil
	},
	"weight": intField(func(e *Endpoint) *int { return &e.Weight }, rejectZero(1, "")),
}

// endpointsField reads hedging.endpoints, a list of {"url": ..., "weight": ...}.
// An upstream's list replaces the defaults'.
func endpointsField(o *HedgingOptions, raw json.RawMessage, path string) error {
	var list []json.RawMessage
	if err := strictUnmarshal(raw, &list); err != nil || list == nil {
		return configErr(path, "want a list of endpoints such as [{\"url\": \"https://a.internal\"}], got %s", brief(raw))
	}
	eps := make([]Endpoint, len(list))
	for i, item := range list {
		p := fmt.Sprintf("%s[%d]", path, i)
		if err := endpointFields.decode(&eps[i], item, p); err != nil {
			return err
		}
		if eps[i].URL == "" {
			return configErr(p+".url", "is missing: every endpoint needs its base URL")
		}
	}
	o.Endpoints = eps
	return nil
}

var perHostFields = fieldSet[PerHostOptions]{
	"enabled": boolField(func(o *PerHostOptions) *bool { return &o.Enabled }),
	"maxHosts": intField(func(o *PerHostOptions) *int { return &o.MaxHosts },
		rejectZero(defaultMaxHosts, "leave perHost.enabled false to share one circuit and one set of limits")),
	"idleTimeout": durationField(func(o *PerHostOptions) *time.Duration { return &o.IdleTimeout },
		rejectZero(defaultHostIdleTimeout, "")),
}

var optionFields = fieldSet[fileOptions]{
	"totalTimeout": durationField(func(o *fileOptions) *time.Duration { return &o.TotalTimeout },
		rejectZero(defaultTotalTimeout, `write a negative duration such as "-1s" to disable the total timeout`)),
	"attemptTimeout": durationField(func(o *fileOptions) *time.Duration { return &o.AttemptTimeout },
		rejectZero(defaultAttemptTimeout, `write a negative duration such as "-1s" to disable the attempt timeout`)),
	"maxBufferedBody": intField(func(o *fileOptions) *int64 { return &o.MaxBufferedBody },
		rejectZero(fmt.Sprintf("%d bytes", defaultMaxBufferedBody), "write a negative number such as -1 to never buffer request bodies")),
	"rateLimit":      objectField(rateLimitFields, func(o *fileOptions) *RateLimitOptions { return &o.RateLimit }),
	"overload":       objectField(overloadFields, func(o *fileOptions) *OverloadOptions { return &o.Overload }),
	"retry":          objectField(retryFields, func(o *fileOptions) *fileOptions { return o }),
	"circuitBreaker": objectField(circuitBreakerFields, func(o *fileOptions) *CircuitBreakerOptions { return &o.CircuitBreaker }),
	"perHost":        objectField(perHostFields, func(o *fileOptions) *PerHostOptions { return &o.PerHost }),
	"retryBudget":    objectField(retryBudgetFields, func(o *fileOptions) *RetryBudgetOptions { return &o.RetryBudget }),
	"hedging":        objectField(hedgingFields, func(o *fileOptions) *HedgingOptions { return &o.Hedging }),
	"fallback":       objectField(fallbackFields, func(o *fileOptions) *FallbackOptions { return &o.Fallback }),
	"logLevels":      logLevelsField,
	"idempotency":    objectField(idempotencyFields, func(o *fileOptions) *IdempotencyOptions { return &o.Idempotency }),
}

func logLevelsField(o *fileOptions, raw json.RawMessage, path string) error {
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
