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

// Config is the Options of named upstreams, as LoadConfig reads them.
type Config struct {
	Upstreams map[string]Options
}

// LoadConfig reads a JSON configuration of at most 1 MiB: "upstreams" holds
// each upstream's Options by name, in lower camel case with durations such
// as "250ms", and "defaults" what each starts from. A zero is the default,
// but four that meant otherwise before are refused. Errors name the upstream
// and the field. See docs/configuration.md.
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

// A zeroRule says what a zero written in a file means for a numeric field:
// as in Options, the field's default (keepZero); or, for the four fields
// whose written zero meant something else before this release
// (retry.maxRetries, retry.delay, circuitBreaker.minimumThroughput,
// hedging.maxExtraLoad), an error that says how to write what it meant
// (refuseZero), so that no file silently changes meaning.
type zeroRule struct {
	refused string // the error's text; empty: keep the zero
}

var keepZero = zeroRule{}

// refuseZero refuses a written zero, which meant was in earlier releases,
// and names instead, what to write for it now.
func refuseZero(was, instead string) zeroRule {
	return zeroRule{refused: "a written 0 meant " + was + " before, and would now mean the default, as a zero does in Options; write " + instead + ", or omit the field for the default"}
}

func (z zeroRule) check(path string, raw json.RawMessage) error {
	if z.refused == "" {
		return nil
	}
	return configErr(path, "%s is refused: %s", brief(raw), z.refused)
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
		keepZero),
	"maxLimit": intField(func(o *OverloadOptions) *int { return &o.MaxLimit },
		keepZero),
	"initialLimit": intField(func(o *OverloadOptions) *int { return &o.InitialLimit },
		keepZero),
	"maxQueue": intField(func(o *OverloadOptions) *int { return &o.MaxQueue },
		keepZero),
	"maxQueueWait": durationField(func(o *OverloadOptions) *time.Duration { return &o.MaxQueueWait },
		keepZero),
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

// retryFields decode into the whole fileOptions, for maxRetries' sake.
var retryFields = fieldSet[fileOptions]{
	"disabled":   boolField(func(o *fileOptions) *bool { return &o.Retry.Disabled }),
	"maxRetries": maxRetriesField,
	"delay":      retryDelayField,
	"maxDelay": durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxDelay },
		keepZero),
	"backoff":          backoffField,
	"noJitter":         boolField(func(o *fileOptions) *bool { return &o.Retry.NoJitter }),
	"methods":          stringsField(func(o *fileOptions) *[]string { return &o.Retry.Methods }),
	"excludeMethods":   stringsField(func(o *fileOptions) *[]string { return &o.Retry.ExcludeMethods }),
	"ignoreRetryAfter": boolField(func(o *fileOptions) *bool { return &o.Retry.IgnoreRetryAfter }),
	"maxRetryAfter":    durationField(func(o *fileOptions) *time.Duration { return &o.Retry.MaxRetryAfter }, keepZero),
}

// maxRetriesField reads retry.maxRetries; a written 0 meant no retries.
var maxRetriesField = intField(func(o *fileOptions) *int { return &o.Retry.MaxRetries },
	refuseZero("no retries", `"disabled": true`))

// retryDelayField reads retry.delay; a written 0 meant no delay.
var retryDelayField = durationField(func(o *fileOptions) *time.Duration { return &o.Retry.Delay },
	refuseZero("no delay", `a negative duration such as "-1s" for no delay`))

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

var retryBudgetFields = fieldSet[RetryBudgetOptions]{
	"disabled": boolField(func(o *RetryBudgetOptions) *bool { return &o.Disabled }),
	"maxTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.MaxTokens },
		keepZero),
	"tokenRatio": floatField(func(o *RetryBudgetOptions) *float64 { return &o.TokenRatio },
		keepZero),
	"retrySuccessTokens": floatField(func(o *RetryBudgetOptions) *float64 { return &o.RetrySuccessTokens },
		keepZero),
}

var hedgingFields = fieldSet[HedgingOptions]{
	"enabled": boolField(func(o *HedgingOptions) *bool { return &o.Enabled }),
	"maxHedges": intField(func(o *HedgingOptions) *int { return &o.MaxHedges },
		keepZero),
	"delay": durationField(func(o *HedgingOptions) *time.Duration { return &o.Delay },
		keepZero),
	"delayPercentile": floatField(func(o *HedgingOptions) *float64 { return &o.DelayPercentile }, keepZero),
	"minDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MinDelay },
		keepZero),
	"maxDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MaxDelay },
		keepZero),
	"maxExtraLoad": maxExtraLoadField,
	"routing":      movedField[HedgingOptions]("routing"),
	"endpoints":    movedField[HedgingOptions]("endpoints"),
}

// movedField refuses a field written where it was before it moved to the
// top level of an upstream, and says where it is now.
func movedField[T any](name string) func(*T, json.RawMessage, string) error {
	return func(_ *T, _ json.RawMessage, path string) error {
		return configErr(path, "moved: write %q beside \"hedging\", for retries and hedges alike", name)
	}
}

// maxExtraLoadField reads hedging.maxExtraLoad; a written 0 meant no cap.
var maxExtraLoadField = floatField(func(o *HedgingOptions) *float64 { return &o.MaxExtraLoad },
	refuseZero("no cap", "-1 (NoExtraLoadCap) for no cap"))

func routingField(o *fileOptions, raw json.RawMessage, path string) error {
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
	"weight": intField(func(e *Endpoint) *int { return &e.Weight }, keepZero),
}

// endpointsField reads endpoints, a list of {"url": ..., "weight": ...}.
// An upstream's list replaces the defaults'.
func endpointsField(o *fileOptions, raw json.RawMessage, path string) error {
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
		keepZero),
	"idleTimeout": durationField(func(o *PerHostOptions) *time.Duration { return &o.IdleTimeout },
		keepZero),
}

var optionFields = fieldSet[fileOptions]{
	"totalTimeout": durationField(func(o *fileOptions) *time.Duration { return &o.TotalTimeout },
		keepZero),
	"attemptTimeout": durationField(func(o *fileOptions) *time.Duration { return &o.AttemptTimeout },
		keepZero),
	"maxBufferedBody": intField(func(o *fileOptions) *int64 { return &o.MaxBufferedBody },
		keepZero),
	"rateLimit":      objectField(rateLimitFields, func(o *fileOptions) *RateLimitOptions { return &o.RateLimit }),
	"overload":       objectField(overloadFields, func(o *fileOptions) *OverloadOptions { return &o.Overload }),
	"retry":          objectField(retryFields, func(o *fileOptions) *fileOptions { return o }),
	"circuitBreaker": objectField(circuitBreakerFields, func(o *fileOptions) *CircuitBreakerOptions { return &o.CircuitBreaker }),
	"perHost":        objectField(perHostFields, func(o *fileOptions) *PerHostOptions { return &o.PerHost }),
	"retryBudget":    objectField(retryBudgetFields, func(o *fileOptions) *RetryBudgetOptions { return &o.RetryBudget }),
	"hedging":        objectField(hedgingFields, func(o *fileOptions) *HedgingOptions { return &o.Hedging }),
	"endpoints":      endpointsField,
	"routing":        routingField,
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
