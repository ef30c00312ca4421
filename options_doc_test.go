package resilience

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each option is declared once, beside its layer: its type and doc, its
// default and validation (resolveX), and its name in a configuration file
// (the layer's field table). This test keeps the three from drifting apart:
// every field of every options type has a file name that is its Go name in
// lower camel case, or is listed here as a Go value a file cannot hold;
// every file name is a field; and every field's comment says its default.
// Adding an option is then one file's change, and this test says which
// part of it is missing.
func TestOptionsDeclaredOnce(t *testing.T) {
	goOnly := map[string]string{ // field: why a file cannot set it
		"Options.Name":                       "the upstream's key in the file",
		"Options.Logger":                     "a Go value",
		"Options.OnEvent":                    "a function",
		"RateLimitOptions.Shared":            "a Go value (see redislimit)",
		"RetryOptions.ShouldRetry":           "a function",
		"RetryOptions.DelayFunc":             "a function",
		"CircuitBreakerOptions.ShouldHandle": "a function",
		"FallbackOptions.Store":              "a Go value",
	}
	noDefault := map[string]string{ // field: why its comment names no default
		"Options.Logger":    "none: nothing is logged",
		"Options.LogLevels": "none: each kind at its own level",
		"Options.OnEvent":   "none: no observer",
		"Endpoint.URL":      "required",
	}
	tables := map[string][]string{
		"Options":               keysOf(optionFields),
		"RateLimitOptions":      keysOf(rateLimitFields),
		"OverloadOptions":       keysOf(overloadFields),
		"RetryOptions":          keysOf(retryFields),
		"RetryBudgetOptions":    keysOf(retryBudgetFields),
		"HedgingOptions":        keysOf(hedgingFields),
		"CircuitBreakerOptions": keysOf(circuitBreakerFields),
		"PerHostOptions":        keysOf(perHostFields),
		"FallbackOptions":       keysOf(fallbackFields),
		"IdempotencyOptions":    keysOf(idempotencyFields),
		"Endpoint":              keysOf(endpointFields),
	}
	moved := map[string]bool{"HedgingOptions.routing": true, "HedgingOptions.endpoints": true} // refused with where they went
	types := map[string]reflect.Type{
		"Options": reflect.TypeFor[Options](), "RateLimitOptions": reflect.TypeFor[RateLimitOptions](),
		"OverloadOptions": reflect.TypeFor[OverloadOptions](), "RetryOptions": reflect.TypeFor[RetryOptions](),
		"RetryBudgetOptions": reflect.TypeFor[RetryBudgetOptions](), "HedgingOptions": reflect.TypeFor[HedgingOptions](),
		"CircuitBreakerOptions": reflect.TypeFor[CircuitBreakerOptions](), "PerHostOptions": reflect.TypeFor[PerHostOptions](),
		"FallbackOptions": reflect.TypeFor[FallbackOptions](), "IdempotencyOptions": reflect.TypeFor[IdempotencyOptions](),
		"Endpoint": reflect.TypeFor[Endpoint](),
	}
	docs := fieldDocs(t)
	for name, typ := range types {
		inFile := map[string]bool{}
		for _, k := range tables[name] {
			inFile[k] = true
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			field := name + "." + f.Name
			if why, ok := goOnly[field]; ok {
				assert.False(t, inFile[jsonPath(f.Name)], "%s is listed as Go only (%s) but has a file name", field, why)
			} else {
				assert.True(t, inFile[jsonPath(f.Name)], "%s has no file name %q in its layer's field table", field, jsonPath(f.Name))
			}
			delete(inFile, jsonPath(f.Name))
			doc, ok := docs[field]
			require.True(t, ok, "%s has no doc comment", field)
			if _, ok := noDefault[field]; !ok {
				assert.Contains(t, strings.ToLower(doc), "default", "%s's comment does not say its default: %q", field, doc)
			}
		}
		for k := range inFile {
			assert.True(t, moved[name+"."+k], "%s's field table has %q, which is no field", name, k)
		}
	}
}

func keysOf[T any](fs fieldSet[T]) []string {
	keys := make([]string, 0, len(fs))
	for k := range fs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// fieldDocs returns the comments of the fields of the package's exported
// struct types, by Type.Field: the comment above a field, the one after it,
// and, for fields that share a comment above a group of lines, that one.
func fieldDocs(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	docs := map[string]string{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			shared := "" // a comment above a field carries over to the fields under it without one
			prevLine := 0
			for _, fl := range st.Fields.List {
				line := fset.Position(fl.Pos()).Line
				var text string
				if fl.Doc != nil {
					text = fl.Doc.Text()
					shared = text
				} else if line == prevLine+1 {
					text = shared
				} else {
					shared = ""
				}
				if fl.Comment != nil {
					text += " " + fl.Comment.Text()
				}
				prevLine = fset.Position(fl.End()).Line
				for _, n := range fl.Names {
					docs[ts.Name.Name+"."+n.Name] = strings.TrimSpace(text)
				}
			}
			return true
		})
	}
	return docs
}

// The layers' order is said in three places, and each says the order the
// code runs them in (standard.go's roundTrip, then attempt.go: the circuit
// breaker admits an attempt before the overload limiter gives it a slot):
// the Options doc, standard.go's comment and the README's defaults table.
// The README's table had the overload limiter second, after admission.
func TestLayerOrderAgrees(t *testing.T) {
	layers := []string{"admission", "total timeout", "retry", "circuit breaker", "overload", "attempt timeout"}
	read := func(name string) string {
		data, err := os.ReadFile(name)
		require.NoError(t, err)
		return string(data)
	}
	// between returns the text of s from the first from to the next to.
	between := func(s, from, to string) string {
		_, after, ok := strings.Cut(s, from)
		require.True(t, ok, "%q not found", from)
		text, _, ok := strings.Cut(after, to)
		require.True(t, ok, "%q not found after %q", to, from)
		return text
	}
	for _, src := range []struct {
		where, text string
		marks       []string // each layer's name there, in layers' order
	}{
		{"the Options doc (options.go)", between(read("options.go"), "The layers, outermost first:", "See docs/defaults.md"),
			[]string{"RateLimit", "TotalTimeout", "Retry", "CircuitBreaker", "Overload", "AttemptTimeout"}},
		{"standard.go's comment", between(read("standard.go"), "The standard stack, outermost first:", "One call is one"),
			[]string{"admission", "total deadline", "retry", "circuit breaker", "overload", "attempt deadline"}},
		{"README.md's defaults table", between(read("README.md"), "## Defaults", "\n## "),
			[]string{"\n| admission |", "\n| total timeout |", "\n| retry |", "\n| circuit breaker |", "\n| overload |", "\n| attempt timeout |"}},
		{"docs/defaults.md's table", between(read("docs/defaults.md"), "## The layers and their defaults", "\n## "),
			[]string{"\n| admission |", "\n| total timeout |", "\n| retry |", "\n| circuit breaker |", "\n| overload |", "\n| attempt timeout |"}},
	} {
		at := make([]int, len(layers))
		for i, mark := range src.marks {
			at[i] = strings.Index(src.text, mark)
			require.GreaterOrEqual(t, at[i], 0, "%s does not name the %s layer (%q)", src.where, layers[i], mark)
		}
		got := slices.Clone(layers)
		sort.SliceStable(got, func(i, j int) bool { return at[slices.Index(layers, got[i])] < at[slices.Index(layers, got[j])] })
		assert.Equal(t, layers, got, "%s orders the layers differently from the code", src.where)
	}
}
