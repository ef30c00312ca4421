package resilience

import (
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
