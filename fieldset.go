package resilience

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
)

func configErr(path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	return errors.New("resilience: config: " + msg)
}

// goField matches an Options field path in a validation message.
var goField = regexp.MustCompile(`\b[A-Z][a-z][A-Za-z]*(\.[A-Z][a-z][A-Za-z]*)*\b`)

// jsonReason turns the Options field paths in a validation message into
// their names in the configuration, leaving quoted values as written.
func jsonReason(reason string) string {
	parts := strings.Split(reason, `"`)
	for i := 0; i < len(parts); i += 2 { // the even parts are outside quotes
		parts[i] = goField.ReplaceAllStringFunc(parts[i], jsonPath)
	}
	return strings.Join(parts, `"`)
}

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
