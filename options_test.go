package resilience

import (
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOptionsInvalid(t *testing.T) {
	cases := []struct {
		name  string
		opts  Options
		field string // the field the error must name
		also  string // more text the error must hold, if any
	}{
		{"FailureRatio negative", Options{CircuitBreaker: CircuitBreakerOptions{FailureRatio: -0.1}}, "CircuitBreaker.FailureRatio", ""},
		{"FailureRatio above 1", Options{CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1.5}}, "CircuitBreaker.FailureRatio", ""},
		{"FailureRatio NaN", Options{CircuitBreaker: CircuitBreakerOptions{FailureRatio: math.NaN()}}, "CircuitBreaker.FailureRatio", ""},
		{"FailureRatio +Inf", Options{CircuitBreaker: CircuitBreakerOptions{FailureRatio: math.Inf(1)}}, "CircuitBreaker.FailureRatio", ""},
		{"MinimumThroughput negative", Options{CircuitBreaker: CircuitBreakerOptions{MinimumThroughput: -1}}, "CircuitBreaker.MinimumThroughput", ""},
		{"MaxRetries negative", Options{Retry: RetryOptions{MaxRetries: -1}}, "Retry.MaxRetries", "Disabled"},
		{"MaxDelay negative", Options{Retry: RetryOptions{MaxDelay: -time.Second}}, "Retry.MaxDelay", ""},
		{"MaxRetryAfter negative", Options{Retry: RetryOptions{MaxRetryAfter: -time.Second}}, "Retry.MaxRetryAfter", ""},
		{"SamplingDuration negative", Options{CircuitBreaker: CircuitBreakerOptions{SamplingDuration: -time.Second}}, "CircuitBreaker.SamplingDuration", ""},
		{"BreakDuration negative", Options{CircuitBreaker: CircuitBreakerOptions{BreakDuration: -time.Second}}, "CircuitBreaker.BreakDuration", ""},
		{"MaxConcurrent negative", Options{RateLimit: RateLimitOptions{MaxConcurrent: -1}}, "RateLimit.MaxConcurrent", ""},
		{"MaxQueue negative", Options{RateLimit: RateLimitOptions{MaxQueue: -1}}, "RateLimit.MaxQueue", ""},
		{"Burst negative", Options{RateLimit: RateLimitOptions{RequestsPerSecond: 1, Burst: -1}}, "RateLimit.Burst", ""},
		{"RequestsPerSecond NaN", Options{RateLimit: RateLimitOptions{RequestsPerSecond: math.NaN()}}, "RateLimit.RequestsPerSecond", ""},
		{"RequestsPerSecond +Inf", Options{RateLimit: RateLimitOptions{RequestsPerSecond: math.Inf(1)}}, "RateLimit.RequestsPerSecond", ""},
		{"RequestsPerSecond -Inf", Options{RateLimit: RateLimitOptions{RequestsPerSecond: math.Inf(-1)}}, "RateLimit.RequestsPerSecond", ""},
		{"RequestsPerSecond negative", Options{RateLimit: RateLimitOptions{RequestsPerSecond: -1}}, "RateLimit.RequestsPerSecond", ""},
		{"Burst without RequestsPerSecond", Options{RateLimit: RateLimitOptions{Burst: 5}}, "RateLimit.Burst", "RequestsPerSecond"},
		{"MaxDelay below Delay", Options{Retry: RetryOptions{Delay: 2 * time.Second, MaxDelay: time.Second}}, "Retry.MaxDelay", "Retry.Delay"},
		{"RequestsPerSecond too small", Options{RateLimit: RateLimitOptions{RequestsPerSecond: 1e-12}}, "RateLimit.RequestsPerSecond", "at least 0.001"},
		{"Burst too large", Options{RateLimit: RateLimitOptions{RequestsPerSecond: 1, Burst: 2_000_000}}, "RateLimit.Burst", "at most"},
		{"hedging MaxDelay below MinDelay", Options{Hedging: HedgingOptions{DelayPercentile: 0.9, MinDelay: 2 * time.Millisecond, MaxDelay: time.Millisecond}}, "Hedging.MaxDelay", "Hedging.MinDelay (2ms)"},
		{"AttemptTimeout above TotalTimeout", Options{TotalTimeout: time.Second, AttemptTimeout: 2 * time.Second}, "AttemptTimeout", "TotalTimeout"},
		{"SamplingDuration under twice AttemptTimeout", Options{AttemptTimeout: time.Second, CircuitBreaker: CircuitBreakerOptions{SamplingDuration: 1500 * time.Millisecond}}, "CircuitBreaker.SamplingDuration", "AttemptTimeout"},
		{"method with a space", Options{Retry: RetryOptions{Methods: []string{"GE T"}}}, "Retry.Methods[0]", ""},
		{"empty method", Options{Retry: RetryOptions{Methods: []string{"PUT", ""}}}, "Retry.Methods[1]", "empty"},
		{"method with a newline", Options{Retry: RetryOptions{Methods: []string{"GET\n"}}}, "Retry.Methods[0]", ""},
		{"excluded method not a token", Options{Retry: RetryOptions{ExcludeMethods: []string{"GE T"}}}, "Retry.ExcludeMethods[0]", ""},
		{"lower-case method", Options{Retry: RetryOptions{Methods: []string{"post"}}}, "Retry.Methods[0]", "POST"},
		{"lower-case excluded method", Options{Retry: RetryOptions{ExcludeMethods: []string{"get"}}}, "Retry.ExcludeMethods[0]", "GET"},
		{"Backoff above range", Options{Retry: RetryOptions{Backoff: BackoffConstant + 1}}, "Retry.Backoff", ""},
		{"Backoff below range", Options{Retry: RetryOptions{Backoff: -1}}, "Retry.Backoff", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Name = "opt-test"
			var (
				h   *Handler
				tr  *Transport
				err error
			)
			require.NotPanics(t, func() { h, err = NewHandler(tc.opts) })
			require.Error(t, err)
			assert.Nil(t, h)
			msg := err.Error()
			assert.Contains(t, msg, "resilience: ")
			assert.Contains(t, msg, `handler "opt-test"`)
			assert.Contains(t, msg, "invalid option "+tc.field+" ")
			if tc.also != "" {
				assert.Contains(t, msg, tc.also)
			}

			require.NotPanics(t, func() { tr, err = NewTransport(nil, tc.opts) })
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
}

func TestOptionsValid(t *testing.T) {
	cases := []struct {
		name string
		opts Options
	}{
		{"zero", Options{}},
		{"custom method PURGE", Options{Retry: RetryOptions{Methods: []string{"PURGE", "PUT"}, ExcludeMethods: []string{"GET"}}}},
		{"token characters", Options{Retry: RetryOptions{Methods: []string{"M-SEARCH", "X_Y.Z!#$%&'*+^`|~"}}}},
		{"timeouts disabled", Options{TotalTimeout: -1, AttemptTimeout: -1}},
		{"total timeout disabled, attempt timeout default", Options{TotalTimeout: -1}},
		{"sampling under twice the attempt timeout, breaker disabled", Options{
			AttemptTimeout: time.Second,
			CircuitBreaker: CircuitBreakerOptions{Disabled: true, SamplingDuration: 1500 * time.Millisecond},
		}},
		{"sampling under twice a disabled attempt timeout", Options{
			AttemptTimeout: -1,
			CircuitBreaker: CircuitBreakerOptions{SamplingDuration: 10 * time.Millisecond},
		}},
		{"ratio 1", Options{CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1}}},
		{"MaxDelay equals Delay", Options{Retry: RetryOptions{Delay: time.Second, MaxDelay: time.Second}}},
		{"rate with burst", Options{RateLimit: RateLimitOptions{RequestsPerSecond: 10, Burst: 5}}},
		{"fractional rate", Options{RateLimit: RateLimitOptions{RequestsPerSecond: 0.5}}},
		{"everything disabled", Options{
			RateLimit:      RateLimitOptions{Disabled: true},
			Retry:          RetryOptions{Disabled: true},
			CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		}},
		{"every backoff", Options{Retry: RetryOptions{Backoff: BackoffLinear}}},
		{"no delay", Options{Retry: RetryOptions{Delay: -1}}},
		{"no delay, linear", Options{Retry: RetryOptions{Delay: -time.Second, Backoff: BackoffLinear}}},
		{"no delay, MaxDelay set", Options{Retry: RetryOptions{Delay: -1, MaxDelay: time.Second}}},
		{"DelayFunc", Options{Retry: RetryOptions{DelayFunc: func(DelayInfo) time.Duration { return 0 }}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var (
				h   *Handler
				err error
			)
			require.NotPanics(t, func() { h, err = NewHandler(tc.opts) })
			require.NoError(t, err)
			require.NotNil(t, h)
			assert.Equal(t, CircuitClosed, h.CircuitState())
		})
	}
}

func TestOptionsNegativeTimeoutsDisable(t *testing.T) {
	cfg, err := resolve(Options{TotalTimeout: -1, AttemptTimeout: -time.Second})
	require.NoError(t, err)
	assert.Negative(t, cfg.TotalTimeout)
	assert.Negative(t, cfg.AttemptTimeout)

	// A handler built so still serves calls.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr, err := NewTransport(&http.Transport{}, Options{TotalTimeout: -1, AttemptTimeout: -1})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	status, err := cbGet(t, tr, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusNoContent, status)
}

func TestOptionsDefaults(t *testing.T) {
	cfg, err := resolve(Options{})
	require.NoError(t, err)
	assert.Equal(t, "standard", cfg.Name)
	assert.Equal(t, defaultName, cfg.Name)

	assert.False(t, cfg.RateLimit.Disabled)
	assert.Equal(t, 1000, cfg.RateLimit.MaxConcurrent)
	assert.Zero(t, cfg.RateLimit.MaxQueue)
	assert.Zero(t, cfg.RateLimit.RequestsPerSecond)
	assert.Zero(t, cfg.RateLimit.Burst)

	assert.Equal(t, 30*time.Second, cfg.TotalTimeout)
	assert.Equal(t, 10*time.Second, cfg.AttemptTimeout)

	assert.False(t, cfg.Retry.Disabled)
	assert.Equal(t, 3, cfg.Retry.MaxRetries)
	assert.Equal(t, 2*time.Second, cfg.Retry.Delay)
	assert.Equal(t, 30*time.Second, cfg.Retry.MaxDelay)
	assert.Equal(t, BackoffExponential, cfg.Retry.Backoff)
	assert.False(t, cfg.Retry.NoJitter)
	assert.False(t, cfg.Retry.IgnoreRetryAfter)
	assert.Zero(t, cfg.Retry.MaxRetryAfter)
	assert.True(t, cfg.methods.allows(http.MethodGet))
	assert.True(t, cfg.methods.allows(""), "an empty method is GET")
	for _, m := range []string{http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		assert.False(t, cfg.methods.allows(m), "%s is not retried by default", m)
	}

	assert.False(t, cfg.CircuitBreaker.Disabled)
	assert.Equal(t, 0.9, cfg.CircuitBreaker.FailureRatio)
	assert.Equal(t, 100, cfg.CircuitBreaker.MinimumThroughput)
	assert.Equal(t, 30*time.Second, cfg.CircuitBreaker.SamplingDuration)
	assert.Equal(t, time.Second, cfg.CircuitBreaker.BreakDuration)

	assert.False(t, cfg.RetryBudget.Disabled)
	assert.Equal(t, 25.0, cfg.RetryBudget.MaxTokens)
	assert.Equal(t, 0.2, cfg.RetryBudget.TokenRatio)
	assert.Equal(t, 6.0, cfg.RetryBudget.RetrySuccessTokens)

	assert.EqualValues(t, 1<<20, cfg.MaxBufferedBody)
	assert.Nil(t, cfg.Logger)
	assert.Nil(t, cfg.OnEvent)
}

// Issue 20: a default yields to an explicit value it would contradict;
// only explicit values that contradict each other are an error.
func TestOptionsDefaultsYield(t *testing.T) {
	cfg, err := resolve(Options{TotalTimeout: 5 * time.Second})
	require.NoError(t, err, "a TotalTimeout under the default AttemptTimeout")
	assert.Equal(t, 5*time.Second, cfg.AttemptTimeout, "the attempt timeout yields to the total")
	assert.Equal(t, defaultSamplingDuration, cfg.CircuitBreaker.SamplingDuration)

	cfg, err = resolve(Options{TotalTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, defaultAttemptTimeout, cfg.AttemptTimeout, "a longer total leaves the default")

	cfg, err = resolve(Options{TotalTimeout: -1})
	require.NoError(t, err)
	assert.Equal(t, defaultAttemptTimeout, cfg.AttemptTimeout, "no total timeout: the default")

	cfg, err = resolve(Options{TotalTimeout: 5 * time.Second, AttemptTimeout: -1})
	require.NoError(t, err)
	assert.Negative(t, cfg.AttemptTimeout, "an attempt timeout turned off stays off")

	_, err = resolve(Options{TotalTimeout: 5 * time.Second, AttemptTimeout: 6 * time.Second})
	assert.ErrorContains(t, err, "AttemptTimeout (6s): must not exceed TotalTimeout (5s)", "explicit and contradictory")

	cfg, err = resolve(Options{Retry: RetryOptions{MaxDelay: time.Second}})
	require.NoError(t, err, "a MaxDelay under the default Delay")
	assert.Equal(t, time.Second, cfg.Retry.Delay, "the delay yields to the cap")
	assert.Equal(t, time.Second, cfg.Retry.MaxDelay)

	_, err = resolve(Options{Retry: RetryOptions{Delay: 2 * time.Second, MaxDelay: time.Second}})
	assert.ErrorContains(t, err, "must not be below Retry.Delay (2s)", "explicit and contradictory")

	cfg, err = resolve(Options{Hedging: HedgingOptions{DelayPercentile: 0.9, MaxDelay: 500 * time.Microsecond}})
	require.NoError(t, err, "a hedging MaxDelay under the default MinDelay")
	assert.Equal(t, 500*time.Microsecond, cfg.Hedging.MinDelay)

	// The same through LoadConfig: JSON and Go mean the same.
	c, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": {"totalTimeout": "5s"}}}`))
	require.NoError(t, err)
	h, err := NewHandler(c.Upstreams["a"])
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, h.cfg.Load().AttemptTimeout)
}

func TestOptionsDefaultsFillOnlyZeroFields(t *testing.T) {
	cfg, err := resolve(Options{
		Name:  "upstream",
		Retry: RetryOptions{Delay: time.Minute, Methods: []string{"PURGE"}, ExcludeMethods: []string{"GET"}},
	})
	require.NoError(t, err)
	assert.Equal(t, "upstream", cfg.Name)
	assert.Equal(t, time.Minute, cfg.Retry.Delay)
	assert.Equal(t, time.Minute, cfg.Retry.MaxDelay, "MaxDelay defaults to Delay when Delay is above 30s")
	assert.True(t, cfg.methods.allows("PURGE"))
	assert.False(t, cfg.methods.allows(http.MethodGet))
}

// Methods widens the set, ExcludeMethods narrows it: a method in both is
// excluded, with no error.
func TestOptionsExcludeMethodsNarrowsMethods(t *testing.T) {
	cfg, err := resolve(Options{Retry: RetryOptions{
		Methods:        []string{http.MethodPut, http.MethodDelete},
		ExcludeMethods: []string{http.MethodDelete, http.MethodGet},
	}})
	require.NoError(t, err)
	assert.True(t, cfg.methods.allows(http.MethodPut))
	assert.False(t, cfg.methods.allows(http.MethodDelete), "excluded, though also in Methods")
	assert.False(t, cfg.methods.allows(http.MethodGet))

	// Hedging follows the same rule, with the same default (GET).
	cfg, err = resolve(Options{Hedging: HedgingOptions{Enabled: true}})
	require.NoError(t, err)
	assert.True(t, cfg.methods.allows(http.MethodGet))
	assert.False(t, cfg.methods.allows(http.MethodHead))
	assert.False(t, cfg.methods.allows(http.MethodOptions))
	cfg, err = resolve(Options{
		Hedging: HedgingOptions{Enabled: true},
		Retry:   RetryOptions{Methods: []string{http.MethodHead, http.MethodOptions}, ExcludeMethods: []string{http.MethodHead}},
	})
	require.NoError(t, err)
	assert.True(t, cfg.methods.allows(http.MethodGet))
	assert.True(t, cfg.methods.allows(http.MethodOptions))
	assert.False(t, cfg.methods.allows(http.MethodHead))
}

// Every standard method has a bit of its own, in standardMethods' order,
// and a set holds exactly what was put in it, standard or not.
func TestMethodSetHoldsWhatWasPut(t *testing.T) {
	for i, m := range standardMethods {
		assert.Equal(t, uint16(1)<<i, methodBit(m), m)
	}
	assert.Zero(t, methodBit("get"), "methods are case-sensitive")
	for _, in := range [][]string{{}, {"GET"}, {"PURGE"}, {"POST", "PURGE", "LOCK"}, standardMethods} {
		s, err := newMethodSet(nil, in, []string{"LOCK"})
		require.Nil(t, err)
		for _, m := range append(slices.Clone(standardMethods), "PURGE", "LOCK", "COPY") {
			assert.Equal(t, slices.Contains(in, m) && m != "LOCK", s.allows(m), "%v: %s", in, m)
		}
	}
}

func TestOptionsHandlerName(t *testing.T) {
	h, err := NewHandler(Options{})
	require.NoError(t, err)
	assert.Equal(t, "standard", h.Name())
	h, err = NewHandler(Options{Name: "payments"})
	require.NoError(t, err)
	assert.Equal(t, "payments", h.Name())
	tr, err := NewTransport(nil, Options{Name: "catalog"})
	require.NoError(t, err)
	assert.Equal(t, "catalog", tr.Handler().Name())
}

func TestOptionsBackoffString(t *testing.T) {
	assert.Equal(t, "exponential", BackoffExponential.String())
	assert.Equal(t, "linear", BackoffLinear.String())
	assert.Equal(t, "constant", BackoffConstant.String())
	assert.Equal(t, "BackoffType(7)", BackoffType(7).String())
}

// A negative Retry.Delay means no delay: it stays negative, and MaxDelay,
// which only caps computed delays, is accepted and has nothing to cap.
func TestOptionsNegativeDelayMeansNoDelay(t *testing.T) {
	for _, r := range []RetryOptions{
		{Delay: -1},
		{Delay: -time.Second, MaxDelay: 5 * time.Second, Backoff: BackoffConstant},
	} {
		cfg, err := resolve(Options{Retry: r})
		require.NoError(t, err)
		assert.Equal(t, r.Delay, cfg.Retry.Delay, "kept, not replaced by the default")
		assert.Positive(t, cfg.Retry.MaxDelay)
		assert.Zero(t, newBackOff(cfg.Retry).NextBackOff())
	}
	// MaxDelay is still checked for itself.
	_, err := resolve(Options{Retry: RetryOptions{Delay: -1, MaxDelay: -1}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid option Retry.MaxDelay (-1ns): must not be negative")
}

// Handler.Options is what the handler runs with: the defaults filled in,
// slices its own, and valid to give back to Update unchanged.
func TestHandlerOptions(t *testing.T) {
	h, err := NewHandler(Options{Retry: RetryOptions{Methods: []string{"PUT"}}})
	require.NoError(t, err)
	o := h.Options()
	want, err := resolve(Options{Retry: RetryOptions{Methods: []string{"PUT"}}})
	require.NoError(t, err)
	assert.Equal(t, want.Options.AttemptTimeout, o.AttemptTimeout)
	assert.Equal(t, defaultName, o.Name)
	assert.Equal(t, defaultMaxRetries, o.Retry.MaxRetries)
	assert.Equal(t, float64(defaultBudgetTokens), o.RetryBudget.MaxTokens)
	assert.Equal(t, defaultOverloadMinLimit, o.Overload.MinLimit)
	assert.Equal(t, defaultMaxExtraLoad, o.Hedging.MaxExtraLoad)

	o.Retry.Methods[0] = "DELETE"
	assert.Equal(t, []string{"PUT"}, h.Options().Retry.Methods, "the slices are copies")

	require.NoError(t, h.Update(h.Options()), "the options in force are valid options")
	assert.Equal(t, o.AttemptTimeout, h.Options().AttemptTimeout)
	o = h.Options()
	o.CircuitBreaker.BreakDuration = 3 * time.Second
	require.NoError(t, h.Update(o))
	assert.Equal(t, 3*time.Second, h.Options().CircuitBreaker.BreakDuration)
	assert.Equal(t, []string{"PUT"}, h.Options().Retry.Methods, "the rest kept")
}
