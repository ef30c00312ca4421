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
func LoadConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Config{}, fmt.Errorf("resilience: config: %w", err)
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
		var o Options
		if raw, ok := top["defaults"]; ok {
			if err := optionFields.decode(&o, raw, "defaults"); err != nil {
				return Config{}, err
			}
		}
		if err := optionFields.decode(&o, upstreams[name], path); err != nil {
			return Config{}, err
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
		if p != "" {
			parts[i] = strings.ToLower(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, ".")
}

var errTrailingData = errors.New("unexpected data after the JSON object")

func strictUnmarshal(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errTrailingData
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

func durationField[T any](field func(*T) *time.Duration) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return configErr(path, "want a duration string such as \"250ms\", got %s", brief(raw))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return configErr(path, "invalid duration %q", s)
		}
		*field(v) = d
		return nil
	}
}

func intField[T any, N int | int64](field func(*T) *N) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil || raw[0] == '"' {
			return configErr(path, "want an integer, got %s", brief(raw))
		}
		i, err := n.Int64()
		if err != nil || int64(N(i)) != i {
			return configErr(path, "want an integer, got %s", brief(raw))
		}
		*field(v) = N(i)
		return nil
	}
}

func floatField[T any](field func(*T) *float64) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil || raw[0] == '"' {
			return configErr(path, "want a number, got %s", brief(raw))
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) {
			return configErr(path, "want a number, got %s", brief(raw))
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

var rateLimitFields = fieldSet[RateLimitOptions]{
	"disabled":          boolField(func(o *RateLimitOptions) *bool { return &o.Disabled }),
	"maxConcurrent":     intField(func(o *RateLimitOptions) *int { return &o.MaxConcurrent }),
	"maxQueue":          intField(func(o *RateLimitOptions) *int { return &o.MaxQueue }),
	"requestsPerSecond": floatField(func(o *RateLimitOptions) *float64 { return &o.RequestsPerSecond }),
	"burst":             intField(func(o *RateLimitOptions) *int { return &o.Burst }),
}

var retryFields = fieldSet[RetryOptions]{
	"disabled":         boolField(func(o *RetryOptions) *bool { return &o.Disabled }),
	"maxRetries":       intField(func(o *RetryOptions) *int { return &o.MaxRetries }),
	"delay":            durationField(func(o *RetryOptions) *time.Duration { return &o.Delay }),
	"maxDelay":         durationField(func(o *RetryOptions) *time.Duration { return &o.MaxDelay }),
	"backoff":          backoffField,
	"noJitter":         boolField(func(o *RetryOptions) *bool { return &o.NoJitter }),
	"methods":          stringsField(func(o *RetryOptions) *[]string { return &o.Methods }),
	"excludeMethods":   stringsField(func(o *RetryOptions) *[]string { return &o.ExcludeMethods }),
	"ignoreRetryAfter": boolField(func(o *RetryOptions) *bool { return &o.IgnoreRetryAfter }),
	"maxRetryAfter":    durationField(func(o *RetryOptions) *time.Duration { return &o.MaxRetryAfter }),
}

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

var circuitBreakerFields = fieldSet[CircuitBreakerOptions]{
	"disabled":          boolField(func(o *CircuitBreakerOptions) *bool { return &o.Disabled }),
	"failureRatio":      floatField(func(o *CircuitBreakerOptions) *float64 { return &o.FailureRatio }),
	"minimumThroughput": intField(func(o *CircuitBreakerOptions) *int { return &o.MinimumThroughput }),
	"samplingDuration":  durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.SamplingDuration }),
	"breakDuration":     durationField(func(o *CircuitBreakerOptions) *time.Duration { return &o.BreakDuration }),
}

var retryBudgetFields = fieldSet[RetryBudgetOptions]{
	"disabled":   boolField(func(o *RetryBudgetOptions) *bool { return &o.Disabled }),
	"maxTokens":  floatField(func(o *RetryBudgetOptions) *float64 { return &o.MaxTokens }),
	"tokenRatio": floatField(func(o *RetryBudgetOptions) *float64 { return &o.TokenRatio }),
}

var hedgingFields = fieldSet[HedgingOptions]{
	"enabled":   boolField(func(o *HedgingOptions) *bool { return &o.Enabled }),
	"maxHedges": intField(func(o *HedgingOptions) *int { return &o.MaxHedges }),
	"delay":     durationField(func(o *HedgingOptions) *time.Duration { return &o.Delay }),
}

var perHostFields = fieldSet[PerHostOptions]{
	"enabled":     boolField(func(o *PerHostOptions) *bool { return &o.Enabled }),
	"maxHosts":    intField(func(o *PerHostOptions) *int { return &o.MaxHosts }),
	"idleTimeout": durationField(func(o *PerHostOptions) *time.Duration { return &o.IdleTimeout }),
}

var optionFields = fieldSet[Options]{
	"totalTimeout":    durationField(func(o *Options) *time.Duration { return &o.TotalTimeout }),
	"attemptTimeout":  durationField(func(o *Options) *time.Duration { return &o.AttemptTimeout }),
	"maxBufferedBody": intField(func(o *Options) *int64 { return &o.MaxBufferedBody }),
	"rateLimit":       objectField(rateLimitFields, func(o *Options) *RateLimitOptions { return &o.RateLimit }),
	"retry":           objectField(retryFields, func(o *Options) *RetryOptions { return &o.Retry }),
	"circuitBreaker":  objectField(circuitBreakerFields, func(o *Options) *CircuitBreakerOptions { return &o.CircuitBreaker }),
	"perHost":         objectField(perHostFields, func(o *Options) *PerHostOptions { return &o.PerHost }),
	"retryBudget":     objectField(retryBudgetFields, func(o *Options) *RetryBudgetOptions { return &o.RetryBudget }),
	"hedging":         objectField(hedgingFields, func(o *Options) *HedgingOptions { return &o.Hedging }),
	"logLevels":       logLevelsField,
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
