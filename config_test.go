package resilience

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func exampleConfig(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/upstreams.json")
	require.NoError(t, err)
	return string(b)
}

func TestLoadConfigExample(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(exampleConfig(t)))
	require.NoError(t, err)
	require.Len(t, cfg.Upstreams, 3)

	pricing := cfg.Upstreams["pricing"]
	assert.Equal(t, "pricing", pricing.Name)
	assert.Equal(t, 10*time.Second, pricing.TotalTimeout, "from the defaults")
	assert.Equal(t, 2*time.Second, pricing.AttemptTimeout, "from the defaults")
	assert.Equal(t, RateLimitOptions{MaxConcurrent: 200, MaxQueue: 20}, pricing.RateLimit)
	assert.Equal(t, CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 20, SamplingDuration: 30 * time.Second, BreakDuration: 5 * time.Second}, pricing.CircuitBreaker)
	assert.Equal(t, RetryOptions{MaxRetries: 2, Delay: 200 * time.Millisecond, MaxDelay: 2 * time.Second, MaxRetryAfter: 5 * time.Second}, pricing.Retry)
	assert.Equal(t, map[EventKind]slog.Level{EventRetry: slog.LevelInfo}, pricing.LogLevels)

	carrier := cfg.Upstreams["carrier"]
	assert.Equal(t, 6*time.Second, carrier.TotalTimeout, "the upstream overrides the defaults")
	assert.Equal(t, []string{"PUT"}, carrier.Retry.Methods)
	assert.Equal(t, BackoffLinear, carrier.Retry.Backoff)
	assert.Equal(t, 200*time.Millisecond, carrier.Retry.Delay, "untouched fields keep the defaults'")
	assert.Equal(t, 10, carrier.CircuitBreaker.MinimumThroughput)

	search := cfg.Upstreams["search"]
	assert.True(t, search.Retry.Disabled)
	assert.Equal(t, 500*time.Millisecond, search.AttemptTimeout)
	assert.Equal(t, PerHostOptions{Enabled: true, MaxHosts: 64, IdleTimeout: 10 * time.Minute}, search.PerHost)
}

// Every mistake a user can make in the example file gets an error that
// names the upstream and the field; none panics.
func TestLoadConfigErrors(t *testing.T) {
	example := exampleConfig(t)
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"bad duration", `"delay": "200ms"`, `"delay": "2x"`, `defaults.retry.delay: invalid duration "2x"`},
		{"duration as a number", `"totalTimeout": "6s"`, `"totalTimeout": 6`, `upstreams.carrier.totalTimeout: want a duration string such as "250ms", got 6`},
		{"integer as a string", `"maxRetries": 2`, `"maxRetries": "2"`, `defaults.retry.maxRetries: want an integer, got "2"`},
		{"fractional integer", `"maxHosts": 64`, `"maxHosts": 6.4`, `upstreams.search.perHost.maxHosts: want an integer, got 6.4`},
		{"negative count", `"maxQueue": 20`, `"maxQueue": -5`, `upstreams.pricing.rateLimit.maxQueue (-5): must not be negative`},
		{"ratio above 1", `"failureRatio": 0.5`, `"failureRatio": 1.5`, `upstreams.pricing.circuitBreaker.failureRatio (1.5): must be in (0, 1]`},
		{"ratio as a string", `"failureRatio": 0.5`, `"failureRatio": "50%"`, `upstreams.pricing.circuitBreaker.failureRatio: want a number, got "50%"`},
		{"unknown field", `"minimumThroughput": 10`, `"minimumThroughputs": 10`, `upstreams.carrier.circuitBreaker.minimumThroughputs: unknown field (known: breakDuration, disabled, failureRatio, minimumThroughput, samplingDuration)`},
		{"unknown top-level field", `"defaults": {`, `"default": {`, `default: unknown field (known: defaults, upstreams)`},
		{"lower-case method", `"methods": ["PUT"]`, `"methods": ["put"]`, `upstreams.carrier.retry.methods[0] (put): methods are case-sensitive; did you mean PUT?`},
		{"invalid method", `"methods": ["PUT"]`, `"methods": ["P UT"]`, `upstreams.carrier.retry.methods[0] (P UT): is not a valid HTTP method token`},
		{"methods not a list", `"methods": ["PUT"]`, `"methods": "PUT"`, `upstreams.carrier.retry.methods: want a list of strings, got "PUT"`},
		{"unknown backoff", `"backoff": "linear"`, `"backoff": "quadratic"`, `upstreams.carrier.retry.backoff: want "exponential", "linear" or "constant", got "quadratic"`},
		{"attempt above total", `"attemptTimeout": "500ms"`, `"attemptTimeout": "20s"`, `upstreams.search.attemptTimeout (20s): must not exceed totalTimeout (10s)`},
		{"sampling under twice the attempt", `"samplingDuration": "30s"`, `"samplingDuration": "3s"`, `upstreams.pricing.circuitBreaker.samplingDuration (3s): must be at least twice attemptTimeout (2s)`},
		{"maxDelay below delay", `"maxDelay": "2s"`, `"maxDelay": "100ms"`, `upstreams.carrier.retry.maxDelay (100ms): must not be below retry.delay (200ms)`},
		{"bad bool", `"enabled": true`, `"enabled": "yes"`, `upstreams.search.perHost.enabled: want true or false, got "yes"`},
		{"bad level", `"retry": "INFO"`, `"retry": "LOUD"`, `defaults.logLevels.retry: invalid level "LOUD" (want DEBUG, INFO, WARN or ERROR)`},
		{"unknown event kind", `"retry": "INFO"`, `"retries": "INFO"`, `defaults.logLevels.retries: unknown event kind`},
		{"object expected", `"retry": { "disabled": true }`, `"retry": true`, `upstreams.search.retry: want an object, got true`},
		{"truncated", `}`, ``, `invalid JSON`},
		{"trailing data", `"upstreams": {`, `"upstreams": {}}, {"upstreams": {`, `unexpected data after the JSON object`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := strings.Replace(example, tc.from, tc.to, 1)
			require.NotEqual(t, example, broken, "the mutation applies to the example")
			_, err := LoadConfig(strings.NewReader(broken))
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "resilience: config: "), err.Error())
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	for _, s := range []string{"", "[]", "null", `{"upstreams": null}`, `{"upstreams": {"": {}}}`, `{"upstreams": {"a": []}}`, `{"upstreams": {"a": {}}} x`} {
		_, err := LoadConfig(strings.NewReader(s))
		assert.Error(t, err, "%q", s)
	}
}

// Three upstreams from one file: three named handlers whose breakers and
// limiters are independent.
func TestConfigHandlersAreIndependent(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{
	  "defaults": {
	    "attemptTimeout": "-1s",
	    "retry": {"disabled": true},
	    "rateLimit": {"maxConcurrent": 1},
	    "circuitBreaker": {"minimumThroughput": 2, "failureRatio": 0.5, "samplingDuration": "1s", "breakDuration": "1m"}
	  },
	  "upstreams": {"pricing": {}, "carrier": {}, "search": {}}
	}`))
	require.NoError(t, err)
	var events []string
	hs, err := cfg.Handlers(func(name string, o *Options) {
		o.OnEvent = func(e Event) { events = append(events, e.Handler+" "+e.Kind.String()) }
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"carrier", "pricing", "search"}, hs.Names())
	_, err = hs.Handler("billing")
	require.EqualError(t, err, `resilience: no upstream "billing" (known: carrier, pricing, search)`)

	failing := cbNewUpstream(http.StatusServiceUnavailable)
	defer failing.Close()
	defer failing.unblock()
	healthy := cbNewUpstream(http.StatusOK)
	defer healthy.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()

	pricing, err := hs.Transport("pricing", base)
	require.NoError(t, err)
	cbTrip(t, pricing, failing, 2)
	pricingHandler, _ := hs.Handler("pricing")
	assert.Equal(t, CircuitOpen, pricingHandler.CircuitState())
	assert.Contains(t, events, "pricing circuit_opened")

	carrier, _ := hs.Transport("carrier", base)
	search, _ := hs.Transport("search", base)
	for _, tr := range []*Transport{carrier, search} {
		status, err := cbGet(t, tr, healthy.URL)
		require.NoError(t, err, "%s's breaker is its own", tr.Handler().Name())
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, CircuitClosed, tr.Handler().CircuitState())
	}

	// carrier's only permit held: carrier rejects, search still admits.
	done := make(chan error, 1)
	go func() { _, err := cbCall(t.Context(), carrier, failing.URL, true); done <- err }()
	failing.waitArrived(t)
	_, err = cbGet(t, carrier, healthy.URL)
	require.ErrorIs(t, err, ErrRateLimited)
	_, err = cbGet(t, search, healthy.URL)
	require.NoError(t, err, "search's limiter is its own")
	failing.unblock()
	<-done

	report := CheckHealth(hs.All()...)
	assert.Equal(t, "degraded", report.Status)
	assert.Equal(t, "open", report.Handlers["pricing"].Circuit)
	assert.Contains(t, report.Handlers["pricing"].Reason, "503")
	assert.Equal(t, "closed", report.Handlers["search"].Circuit)
}

func FuzzLoadConfig(f *testing.F) {
	f.Add(exampleConfig(f))
	f.Add(`{"upstreams": {"a": {}}}`)
	f.Add(`{"defaults": {"retry": {"delay": "1ms"}}, "upstreams": {"a": {"retry": {"maxDelay": "1s"}}}}`)
	f.Add(`{"upstreams": {"a": {"logLevels": {"call": "DEBUG+2"}, "perHost": {"enabled": true}}}}`)
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := LoadConfig(strings.NewReader(s)) // must never panic
		if err != nil {
			if !strings.HasPrefix(err.Error(), "resilience: config: ") {
				t.Fatalf("error %q does not start with the prefix", err)
			}
			return
		}
		if _, err := cfg.Handlers(nil); err != nil {
			t.Fatalf("LoadConfig accepted a configuration that does not build: %v", err)
		}
	})
}

// Issue 20: a zero written in a file means what it means in Options, the
// field's default, in an upstream, in the defaults and under a defaults'
// other value; the four zeros that meant something else before are refused
// with the spelling of what they meant. Every numeric field has a case.
func TestLoadConfigWrittenZero(t *testing.T) {
	type zeroCase struct {
		field   string // path below the upstream or the defaults
		zero    string // the zero as written
		nonzero string // a valid value, for the defaults under an upstream's zero
		refused string // the error's reason, or "" when the zero is the default
	}
	cases := []zeroCase{
		{"totalTimeout", `"0s"`, `"10s"`, ""},
		{"attemptTimeout", `"0s"`, `"2s"`, ""},
		{"maxBufferedBody", `0`, `1024`, ""},
		{"rateLimit.maxConcurrent", `0`, `10`, ""},
		{"rateLimit.maxQueue", `0`, `20`, ""},
		{"rateLimit.requestsPerSecond", `0`, `10`, ""},
		{"rateLimit.burst", `0`, `5`, ""},
		{"retry.maxRetries", `0`, `2`, `a written 0 meant no retries before, and would now mean the default, as a zero does in Options; write "disabled": true, or omit the field for the default`},
		{"retry.delay", `"0s"`, `"200ms"`, `a written 0 meant no delay before, and would now mean the default, as a zero does in Options; write a negative duration such as "-1s" for no delay, or omit the field for the default`},
		{"retry.maxDelay", `"0s"`, `"2s"`, ""},
		{"retry.maxRetryAfter", `"0s"`, `"5s"`, ""},
		{"circuitBreaker.failureRatio", `0`, `0.5`, ""},
		{"circuitBreaker.minimumThroughput", `0`, `20`, `a written 0 meant no minimum before, and would now mean the default, as a zero does in Options; write 1 for no minimum, or omit the field for the default`},
		{"circuitBreaker.samplingDuration", `"0s"`, `"30s"`, ""},
		{"circuitBreaker.breakDuration", `"0s"`, `"5s"`, ""},
		{"retryBudget.maxTokens", `0`, `20`, ""},
		{"retryBudget.tokenRatio", `0`, `0.5`, ""},
		{"retryBudget.retrySuccessTokens", `0`, `2`, ""},
		{"hedging.maxHedges", `0`, `2`, ""},
		{"hedging.delay", `"0s"`, `"1s"`, ""},
		{"hedging.delayPercentile", `0`, `0.95`, ""},
		{"hedging.minDelay", `"0s"`, `"5ms"`, ""},
		{"hedging.maxDelay", `"0s"`, `"1s"`, ""},
		{"hedging.maxExtraLoad", `0`, `0.1`, `a written 0 meant no cap before, and would now mean the default, as a zero does in Options; write -1 (NoExtraLoadCap) for no cap, or omit the field for the default`},
		{"perHost.maxHosts", `0`, `64`, ""},
		{"perHost.idleTimeout", `"0s"`, `"10m"`, ""},
		{"overload.minLimit", `0`, `4`, ""},
		{"overload.maxLimit", `0`, `64`, ""},
		{"overload.initialLimit", `0`, `16`, ""},
		{"overload.maxQueue", `0`, `100`, ""},
		{"overload.maxQueueWait", `"0s"`, `"250ms"`, ""},
		{"fallback.maxStale", `"0s"`, `"1m"`, ""},
		{"fallback.maxEntryBytes", `0`, `1024`, ""},
		{"fallback.maxBytes", `0`, `4096`, ""},
	}

	// Every numeric field of the configuration is in the table.
	nonNumeric := map[string]bool{
		"rateLimit": true, "overload": true, "retry": true, "circuitBreaker": true, "retryBudget": true, "hedging": true, "perHost": true, "logLevels": true,
		"fallback": true, "header": true, "onTransient": true, "shareCredentialed": true,
		"routing": true, "endpoints": true, "propagation": true, "headers": true,
		"disabled": true, "enabled": true, "wait": true, "hedge": true, "idempotency": true, "backoff": true, "noJitter": true, "methods": true, "excludeMethods": true, "ignoreRetryAfter": true,
		"ignoreServerQuota": true, "pauseOn429": true, "strictAttemptTimeout": true,
	}
	var numeric []string
	for prefix, keys := range map[string][]string{
		"":                sortedKeys(optionFields),
		"rateLimit.":      sortedKeys(rateLimitFields),
		"retry.":          sortedKeys(retryFields),
		"circuitBreaker.": sortedKeys(circuitBreakerFields),
		"retryBudget.":    sortedKeys(retryBudgetFields),
		"hedging.":        sortedKeys(hedgingFields),
		"perHost.":        sortedKeys(perHostFields),
		"fallback.":       sortedKeys(fallbackFields),
		"overload.":       sortedKeys(overloadFields),
	} {
		for _, k := range keys {
			if !nonNumeric[k] {
				numeric = append(numeric, prefix+k)
			}
		}
	}
	var covered []string
	for _, tc := range cases {
		covered = append(covered, tc.field)
	}
	require.ElementsMatch(t, numeric, covered, "every numeric field has a case")

	// nest writes {"a": {"b": value}} for the path "a.b".
	nest := func(path, value string) string {
		parts := strings.Split(path, ".")
		s := value
		for i := len(parts) - 1; i >= 0; i-- {
			s = `{"` + parts[i] + `": ` + s + `}`
		}
		return s
	}
	standard := func(t *testing.T) Options {
		h, err := NewHandler(Options{Name: "a"})
		require.NoError(t, err)
		return h.Options()
	}(t)
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			for _, layout := range []struct {
				where, json string
			}{
				{"upstreams.a." + tc.field, `{"upstreams": {"a": ` + nest(tc.field, tc.zero) + `}}`},
				{"upstreams.a." + tc.field, `{"defaults": ` + nest(tc.field, tc.nonzero) + `, "upstreams": {"a": ` + nest(tc.field, tc.zero) + `}}`},
				{"defaults." + tc.field, `{"defaults": ` + nest(tc.field, tc.zero) + `, "upstreams": {"a": {}}}`},
			} {
				cfg, err := LoadConfig(strings.NewReader(layout.json))
				if tc.refused != "" {
					require.Error(t, err, layout.json)
					assert.Equal(t, "resilience: config: "+layout.where+": "+tc.zero+" is refused: "+tc.refused, err.Error())
					continue
				}
				require.NoError(t, err, layout.json)
				h, err := NewHandler(cfg.Upstreams["a"])
				require.NoError(t, err, layout.json)
				assert.Equal(t, standard, h.Options(), "%s: the zero is the default, as in Options", layout.json)
			}
		})
	}

	// Other spellings of zero are zeros too.
	for _, s := range []string{`"0"`, `"0ms"`, `"-0s"`, `"0h0m0s"`} {
		cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"totalTimeout": ` + s + `}}}`))
		require.NoError(t, err, s)
		assert.Zero(t, cfg.Upstreams["a"].TotalTimeout, s)
		_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"retry": {"delay": ` + s + `}}}}`))
		assert.ErrorContains(t, err, "upstreams.a.retry.delay: "+s+" is refused", s)
	}
	for _, s := range []string{`-0`, `0e3`, `0.0`} {
		cfg, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"circuitBreaker": {"failureRatio": ` + s + `}}}}`))
		require.NoError(t, err, s)
		assert.Zero(t, cfg.Upstreams["a"].CircuitBreaker.FailureRatio, s)
		_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"hedging": {"maxExtraLoad": ` + s + `}}}}`))
		assert.ErrorContains(t, err, "upstreams.a.hedging.maxExtraLoad: "+s+" is refused", s)
	}
	_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"retry": {"maxRetries": -0}}}}`))
	assert.ErrorContains(t, err, "upstreams.a.retry.maxRetries: -0 is refused")
}

// retry.disabled is the last word of whichever layer writes it last, and
// maxRetries does not turn retries back on.
func TestLoadConfigRetryDisabledLayers(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		disabled   bool
		retries    int
	}{
		{"upstream", `{"upstreams": {"a": {"retry": {"disabled": true}}}}`, true, 3},
		{"defaults inherited", `{"defaults": {"retry": {"disabled": true}}, "upstreams": {"a": {}}}`, true, 3},
		{"defaults overridden", `{"defaults": {"retry": {"disabled": true}}, "upstreams": {"a": {"retry": {"disabled": false, "maxRetries": 2}}}}`, false, 2},
		{"defaults two, upstream off", `{"defaults": {"retry": {"maxRetries": 2}}, "upstreams": {"a": {"retry": {"disabled": true}}}}`, true, 2},
		{"explicit disabled kept", `{"defaults": {"retry": {"disabled": true}}, "upstreams": {"a": {"retry": {"maxRetries": 2}}}}`, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := LoadConfig(strings.NewReader(tc.json))
			require.NoError(t, err)
			h, err := NewHandler(cfg.Upstreams["a"])
			require.NoError(t, err)
			assert.Equal(t, tc.disabled, h.Options().Retry.Disabled)
			assert.Equal(t, tc.retries, h.Options().Retry.MaxRetries)
		})
	}
}

// "disabled": true in a file sends one request, not the default four.
func TestLoadConfigRetryDisabledSendsOnce(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		requests   int64
	}{
		{"upstream", `{"upstreams": {"a": {"retry": {"disabled": true, "delay": "1ms"}}}}`, 1},
		{"defaults", `{"defaults": {"retry": {"disabled": true, "delay": "1ms"}}, "upstreams": {"a": {}}}`, 1},
		{"defaults overridden", `{"defaults": {"retry": {"disabled": true, "delay": "1ms"}}, "upstreams": {"a": {"retry": {"disabled": false, "maxRetries": 2}}}}`, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			cfg, err := LoadConfig(strings.NewReader(tc.json))
			require.NoError(t, err)
			c := newTestClient(t, cfg.Upstreams["a"])
			resp, err := c.getBounded(t, up.URL())
			require.NoError(t, err)
			readBody(t, resp)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, tc.requests, up.requests.Load())
		})
	}
}

// Nothing but white space may follow the document: not even a closing
// delimiter, which json.Decoder.More does not see.
func TestLoadConfigTrailingData(t *testing.T) {
	const doc = `{"upstreams": {"a": {}}}`
	for _, tail := range []string{"}", "]", " }", "\n]\n", "x", "{}", `{"upstreams": {"b": {}}}`, "0", `"s"`, ",", ":", "null", "\x00", "/* */"} {
		_, err := LoadConfig(strings.NewReader(doc + tail))
		stray := strings.TrimLeft(tail, " \n")
		at := len(doc) + len(tail) - len(stray) + 1 // counted from 1
		stray = stray[:min(len(stray), 16)]         // the error quotes the start of it
		if assert.Error(t, err, "%q", tail) {
			assert.Equal(t, fmt.Sprintf("resilience: config: unexpected data after the JSON object at byte %d: %q", at, stray), err.Error())
		}
	}
	for _, tail := range []string{"", " ", "\n", "\r\n\t  \n"} {
		_, err := LoadConfig(strings.NewReader(doc + tail))
		assert.NoError(t, err, "%q", tail)
	}
}

// testSpaces is a reader of n spaces that counts what is read from it.
type testSpaces struct{ n, read int }

func (s *testSpaces) Read(p []byte) (int, error) {
	if s.read >= s.n {
		return 0, io.EOF
	}
	k := min(len(p), s.n-s.read)
	for i := range p[:k] {
		p[i] = ' '
	}
	s.read += k
	return k, nil
}

// LoadConfig reads at most 1 MiB, and says so when the input is longer.
func TestLoadConfigSizeLimit(t *testing.T) {
	const doc = `{"upstreams": {"a": {}}}`
	atLimit := &testSpaces{n: maxConfigSize - len(doc)}
	_, err := LoadConfig(io.MultiReader(strings.NewReader(doc), atLimit))
	require.NoError(t, err, "exactly 1 MiB loads")

	over := &testSpaces{n: maxConfigSize - len(doc) + 1}
	_, err = LoadConfig(io.MultiReader(strings.NewReader(doc), over))
	require.EqualError(t, err, "resilience: config: the configuration is larger than 1 MiB (1048576 bytes), the most LoadConfig reads")

	huge := &testSpaces{n: 16 << 20}
	_, err = LoadConfig(io.MultiReader(strings.NewReader(doc), huge))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "larger than 1 MiB")
	assert.Equal(t, maxConfigSize+1, len(doc)+huge.read, "reading stops one byte past the limit")
}

// Methods widens the set and ExcludeMethods narrows it, across layers: the
// defaults retry PUT and DELETE, one upstream excludes DELETE.
func TestLoadConfigExcludeMethodsNarrowsDefaults(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{
	  "defaults": {"retry": {"methods": ["PUT", "DELETE"], "maxRetries": 2, "delay": "1ms", "noJitter": true}},
	  "upstreams": {
	    "orders": {"retry": {"excludeMethods": ["DELETE"]}},
	    "carts": {}
	  }
	}`))
	require.NoError(t, err)
	for _, tc := range []struct {
		upstream, method string
		requests         int64
	}{
		{"orders", http.MethodDelete, 1},
		{"orders", http.MethodPut, 3},
		{"orders", http.MethodGet, 3},
		{"carts", http.MethodDelete, 3},
	} {
		t.Run(tc.upstream+" "+tc.method, func(t *testing.T) {
			up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			c := newTestClient(t, cfg.Upstreams[tc.upstream])
			resp, err := c.Do(newTestRequest(t, t.Context(), tc.method, up.URL(), nil))
			require.NoError(t, err)
			readBody(t, resp)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, tc.requests, up.requests.Load())
		})
	}
}

// A negative "delay" in a file retries at once, as in Options, where it is
// written and where it is inherited, and a later layer's delay overrides it.
func TestLoadConfigNegativeDelayRetriesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       []time.Duration
	}{
		{"upstream", `{"defaults": {"retry": {"delay": "200ms"}}, "upstreams": {"a": {"retry": {"delay": "-1s", "maxDelay": "1s"}}}}`, []time.Duration{0, 0}},
		{"defaults", `{"defaults": {"retry": {"delay": "-1s"}}, "upstreams": {"a": {"retry": {"backoff": "linear"}}}}`, []time.Duration{0, 0}},
		{"defaults overridden", `{"defaults": {"retry": {"delay": "-1s"}}, "upstreams": {"a": {"retry": {"delay": "1ms", "noJitter": true}}}}`, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, n int) {
				if n <= 2 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				io.WriteString(w, "ok")
			})
			cfg, err := LoadConfig(strings.NewReader(tc.json))
			require.NoError(t, err)
			c := newTestClient(t, cfg.Upstreams["a"])
			resp, err := c.getBounded(t, up.URL())
			require.NoError(t, err)
			assert.Equal(t, "ok", readBody(t, resp))
			assert.EqualValues(t, 3, up.requests.Load())
			var delays []time.Duration
			for _, e := range c.events.ofKind(EventRetry) {
				delays = append(delays, e.Delay)
			}
			assert.Equal(t, tc.want, delays)
		})
	}
}

// Endpoints and weights in a named upstream; mistakes name the field.
func TestLoadConfigEndpoints(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{
	  "upstreams": {"orders": {
	    "hedging": {"enabled": true, "delay": "300ms", "delayPercentile": 0.95, "maxExtraLoad": 0.1},
	    "routing": "weighted",
	    "endpoints": [{"url": "https://stable.orders.internal", "weight": 90},
	                  {"url": "https://canary.orders.internal/v2", "weight": 10}]}}}`))
	require.NoError(t, err)
	o := cfg.Upstreams["orders"]
	assert.Equal(t, RouteWeighted, o.Routing)
	assert.Equal(t, []Endpoint{{URL: "https://stable.orders.internal", Weight: 90}, {URL: "https://canary.orders.internal/v2", Weight: 10}}, o.Endpoints)
	assert.Equal(t, 0.95, o.Hedging.DelayPercentile)
	assert.Equal(t, 0.1, o.Hedging.MaxExtraLoad)
	_, err = cfg.Handlers(nil)
	require.NoError(t, err)

	for _, tc := range []struct{ fields, want string }{
		{`"routing": "random"`, `upstreams.a.routing: want "ordered" or "weighted", got "random"`},
		{`"endpoints": "http://a"`, `upstreams.a.endpoints: want a list of endpoints`},
		{`"endpoints": [{"url": "http://a", "wieght": 2}]`, `upstreams.a.endpoints[0].wieght: unknown field (known: url, weight)`},
		{`"endpoints": [{"weight": 2}]`, `upstreams.a.endpoints[0].url: is missing`},
		{`"endpoints": [{"url": "http://a"}, {"url": "ftp://b"}]`, `upstreams.a.endpoints[1].url (ftp://b): must start with`},
		{`"endpoints": [{"url": "http://a"}, {"url": "http://a/v2"}]`, `has the authority of endpoints[0]`},
		{`"hedging": {"routing": "weighted"}`, `upstreams.a.hedging.routing: moved: write "routing" beside "hedging"`},
		{`"hedging": {"delayPercentile": 95}`, `upstreams.a.hedging.delayPercentile (95): must be in (0, 1)`},
	} {
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {` + tc.fields + `}}}`))
		require.Error(t, err, tc.fields)
		assert.Contains(t, err.Error(), tc.want)
	}
	cfg0, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"endpoints": [{"url": "http://a", "weight": 0}]}}}`))
	require.NoError(t, err, "a written weight 0 is the default, as in Options; no perHost needed")
	assert.Zero(t, cfg0.Upstreams["a"].Endpoints[0].Weight)
}
