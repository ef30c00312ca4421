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

// A zero written in a file is a deliberate value, never "the default": it is
// honoured where Options can say what it says, and rejected, with the field's
// path and the way to say what was meant, where it cannot. The rule applies
// where the zero is written, in an upstream or in the defaults it inherits.
func TestLoadConfigWrittenZero(t *testing.T) {
	type zeroCase struct {
		field   string // path below the upstream or the defaults
		zero    string // the zero as written
		nonzero string // a valid value, for the defaults under an upstream's zero
		want    string // the error's hint after "omit the field for the default", or "" when the zero is honoured
		check   func(t *testing.T, o Options)
	}
	cases := []zeroCase{
		{"totalTimeout", `"0s"`, `"10s"`, ` (30s) or write a negative duration such as "-1s" to disable the total timeout`, nil},
		{"attemptTimeout", `"0s"`, `"2s"`, ` (10s) or write a negative duration such as "-1s" to disable the attempt timeout`, nil},
		{"maxBufferedBody", `0`, `1024`, ` (1048576 bytes) or write a negative number such as -1 to never buffer request bodies`, nil},

		{"rateLimit.maxConcurrent", `0`, `10`, ` (1000) or set rateLimit.disabled to turn admission control off`, nil},
		{"rateLimit.maxQueue", `0`, `20`, "", func(t *testing.T, o Options) {
			assert.Zero(t, o.RateLimit.MaxQueue, "no queue")
		}},
		{"rateLimit.requestsPerSecond", `0`, `10`, "", func(t *testing.T, o Options) {
			assert.Zero(t, o.RateLimit.RequestsPerSecond, "no rate limit")
		}},
		{"rateLimit.burst", `0`, `5`, "", func(t *testing.T, o Options) {
			assert.Zero(t, o.RateLimit.Burst, "calls spaced evenly")
		}},

		{"retry.maxRetries", `0`, `2`, "", func(t *testing.T, o Options) {
			assert.True(t, o.Retry.Disabled, "no retries")
		}},
		{"retry.delay", `"0s"`, `"200ms"`, "", func(t *testing.T, o Options) {
			assert.Negative(t, o.Retry.Delay, "no delay: retries go at once")
		}},
		{"retry.maxDelay", `"0s"`, `"2s"`, ` (30s, or retry.delay when that is longer)`, nil},
		{"retry.maxRetryAfter", `"0s"`, `"5s"`, "", func(t *testing.T, o Options) {
			assert.Zero(t, o.Retry.MaxRetryAfter, "no cap but the total timeout")
		}},

		{"circuitBreaker.failureRatio", `0`, `0.5`, ` (0.9) or set circuitBreaker.disabled to turn the circuit breaker off`, nil},
		{"circuitBreaker.minimumThroughput", `0`, `20`, "", func(t *testing.T, o Options) {
			assert.Equal(t, 1, o.CircuitBreaker.MinimumThroughput, "no minimum: the ratio counts from the first attempt")
		}},
		{"circuitBreaker.samplingDuration", `"0s"`, `"30s"`, ` (30s, or twice attemptTimeout when that is longer)`, nil},
		{"circuitBreaker.breakDuration", `"0s"`, `"5s"`, ` (1s) or set circuitBreaker.disabled to turn the circuit breaker off`, nil},

		{"retryBudget.maxTokens", `0`, `20`, ` (25) or set retryBudget.disabled to turn the retry budget off`, nil},
		{"retryBudget.tokenRatio", `0`, `0.5`, ` (0.2) or set retryBudget.disabled to turn the retry budget off`, nil},
		{"retryBudget.retrySuccessTokens", `0`, `2`, ` (6) or set retryBudget.disabled to turn the retry budget off`, nil},

		{"hedging.maxHedges", `0`, `2`, ` (1) or leave hedging.enabled false to send no hedges`, nil},
		{"hedging.delay", `"0s"`, `"1s"`, ` (2s) or write a short duration such as "10ms" to hedge sooner`, nil},
		{"hedging.delayPercentile", `0`, `0.95`, "", func(t *testing.T, o Options) {
			assert.Zero(t, o.Hedging.DelayPercentile, "the fixed delay")
		}},
		{"hedging.minDelay", `"0s"`, `"5ms"`, ` (1ms)`, nil},
		{"hedging.maxDelay", `"0s"`, `"1s"`, ` (hedging.delay)`, nil},
		{"hedging.maxExtraLoad", `0`, `0.1`, "", func(t *testing.T, o Options) {
			assert.Equal(t, NoExtraLoadCap, o.Hedging.MaxExtraLoad, "a written 0 is no cap")
		}},

		{"perHost.maxHosts", `0`, `64`, ` (1000) or leave perHost.enabled false to share one circuit and one set of limits`, nil},
		{"perHost.idleTimeout", `"0s"`, `"10m"`, ` (5m0s)`, nil},
		{"overload.minLimit", `0`, `4`, ` (8)`, nil},
		{"overload.maxLimit", `0`, `64`, ` (1000)`, nil},
		{"overload.initialLimit", `0`, `16`, ` (20)`, nil},
		{"overload.maxQueue", `0`, `100`, ` (1000)`, nil},
		{"overload.maxQueueWait", `"0s"`, `"250ms"`, ` (1s)`, nil},

		{"fallback.maxStale", `"0s"`, `"1m"`, ` (10m0s) or leave fallback.enabled false to serve no stale responses`, nil},
		{"fallback.maxEntryBytes", `0`, `1024`, ` (1048576)`, nil},
		{"fallback.maxBytes", `0`, `4096`, ` (67108864)`, nil},
	}

	// Every numeric field of the configuration is in the table.
	nonNumeric := map[string]bool{
		"rateLimit": true, "overload": true, "retry": true, "circuitBreaker": true, "retryBudget": true, "hedging": true, "perHost": true, "logLevels": true,
		"fallback": true, "header": true, "onTransient": true, "shareCredentialed": true,
		"routing": true, "endpoints": true,
		"disabled": true, "enabled": true, "wait": true, "hedge": true, "idempotency": true, "backoff": true, "noJitter": true, "methods": true, "excludeMethods": true, "ignoreRetryAfter": true,
		"ignoreServerQuota": true, "pauseOn429": true,
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
				if tc.want == "" {
					require.NoError(t, err, layout.json)
					tc.check(t, cfg.Upstreams["a"])
					_, err = cfg.Handlers(nil)
					require.NoError(t, err, "%s builds", layout.json)
					continue
				}
				require.Error(t, err, layout.json)
				assert.Equal(t, "resilience: config: "+layout.where+": "+tc.zero+
					" is not allowed here; omit the field for the default"+tc.want, err.Error())
			}
		})
	}

	// Other spellings of zero are zeros too.
	for _, s := range []string{`"0"`, `"0ms"`, `"-0s"`, `"0h0m0s"`} {
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"totalTimeout": ` + s + `}}}`))
		require.Error(t, err, s)
		assert.Contains(t, err.Error(), "upstreams.a.totalTimeout: "+s+" is not allowed here", s)
	}
	for _, s := range []string{`-0`, `0e3`, `0.0`} {
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"circuitBreaker": {"failureRatio": ` + s + `}}}}`))
		require.Error(t, err, s)
		assert.Contains(t, err.Error(), "upstreams.a.circuitBreaker.failureRatio: "+s+" is not allowed here", s)
	}
	_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"rateLimit": {"maxConcurrent": -0}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "upstreams.a.rateLimit.maxConcurrent: -0 is not allowed here")
}

// maxRetries 0 is the last word of whichever layer writes it last.
func TestLoadConfigMaxRetriesLayers(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		disabled   bool
		retries    int
	}{
		{"upstream zero", `{"upstreams": {"a": {"retry": {"maxRetries": 0}}}}`, true, 0},
		{"defaults zero inherited", `{"defaults": {"retry": {"maxRetries": 0}}, "upstreams": {"a": {}}}`, true, 0},
		{"defaults zero overridden", `{"defaults": {"retry": {"maxRetries": 0}}, "upstreams": {"a": {"retry": {"maxRetries": 2}}}}`, false, 2},
		{"defaults two, upstream zero", `{"defaults": {"retry": {"maxRetries": 2}}, "upstreams": {"a": {"retry": {"maxRetries": 0}}}}`, true, 0},
		{"explicit disabled kept", `{"defaults": {"retry": {"disabled": true}}, "upstreams": {"a": {"retry": {"maxRetries": 2}}}}`, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := LoadConfig(strings.NewReader(tc.json))
			require.NoError(t, err)
			assert.Equal(t, tc.disabled, cfg.Upstreams["a"].Retry.Disabled)
			assert.Equal(t, tc.retries, cfg.Upstreams["a"].Retry.MaxRetries)
		})
	}
}

// "maxRetries": 0 in a file means one request, not the default four.
func TestLoadConfigMaxRetriesZeroSendsOnce(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		requests   int64
	}{
		{"upstream", `{"upstreams": {"a": {"retry": {"maxRetries": 0, "delay": "1ms"}}}}`, 1},
		{"defaults", `{"defaults": {"retry": {"maxRetries": 0, "delay": "1ms"}}, "upstreams": {"a": {}}}`, 1},
		{"defaults overridden", `{"defaults": {"retry": {"maxRetries": 0, "delay": "1ms"}}, "upstreams": {"a": {"retry": {"maxRetries": 2}}}}`, 3},
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

// "delay": "0s" in a file retries at once, where it is written and where it
// is inherited, and a later layer's delay overrides it.
func TestLoadConfigZeroDelayRetriesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       []time.Duration
	}{
		{"upstream", `{"defaults": {"retry": {"delay": "200ms"}}, "upstreams": {"a": {"retry": {"delay": "0s", "maxDelay": "1s"}}}}`, []time.Duration{0, 0}},
		{"defaults", `{"defaults": {"retry": {"delay": "0s"}}, "upstreams": {"a": {"retry": {"backoff": "linear"}}}}`, []time.Duration{0, 0}},
		{"defaults overridden", `{"defaults": {"retry": {"delay": "0s"}}, "upstreams": {"a": {"retry": {"delay": "1ms", "noJitter": true}}}}`, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
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
	  "defaults": {"perHost": {"enabled": true}},
	  "upstreams": {"orders": {"hedging": {
	    "enabled": true, "delay": "300ms", "delayPercentile": 0.95, "maxExtraLoad": 0.1,
	    "routing": "weighted",
	    "endpoints": [{"url": "https://stable.orders.internal", "weight": 90},
	                  {"url": "https://canary.orders.internal/v2", "weight": 10}]}}}}`))
	require.NoError(t, err)
	hg := cfg.Upstreams["orders"].Hedging
	assert.Equal(t, RouteWeighted, hg.Routing)
	assert.Equal(t, []Endpoint{{URL: "https://stable.orders.internal", Weight: 90}, {URL: "https://canary.orders.internal/v2", Weight: 10}}, hg.Endpoints)
	assert.Equal(t, 0.95, hg.DelayPercentile)
	assert.Equal(t, 0.1, hg.MaxExtraLoad)
	_, err = cfg.Handlers(nil)
	require.NoError(t, err)

	for _, tc := range []struct{ hedging, want string }{
		{`{"routing": "random"}`, `upstreams.a.hedging.routing: want "ordered" or "weighted", got "random"`},
		{`{"endpoints": "http://a"}`, `upstreams.a.hedging.endpoints: want a list of endpoints`},
		{`{"endpoints": [{"url": "http://a", "wieght": 2}]}`, `upstreams.a.hedging.endpoints[0].wieght: unknown field (known: url, weight)`},
		{`{"endpoints": [{"weight": 2}]}`, `upstreams.a.hedging.endpoints[0].url: is missing`},
		{`{"endpoints": [{"url": "http://a", "weight": 0}]}`, `upstreams.a.hedging.endpoints[0].weight: 0 is not allowed here; omit the field for the default (1)`},
		{`{"endpoints": [{"url": "http://a"}, {"url": "ftp://b"}]}`, `upstreams.a.hedging.endpoints[1].url (ftp://b): must start with`},
		{`{"endpoints": [{"url": "http://a"}, {"url": "http://a/v2"}]}`, `has the authority of hedging.endpoints[0]`},
		{`{"delayPercentile": 95}`, `upstreams.a.hedging.delayPercentile (95): must be in (0, 1)`},
	} {
		perHost := `"perHost": {"enabled": true}, `
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {` + perHost + `"hedging": ` + tc.hedging + `}}}`))
		require.Error(t, err, tc.hedging)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"hedging": {"endpoints": [{"url": "http://a"}]}}}}`))
	assert.ErrorContains(t, err, "upstreams.a.hedging.endpoints (1): needs perHost.enabled")
}
