package resilience

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/server"
)

// Issue 29, item 9: a default yields to an explicit value it would
// contradict, upward as well as downward, for every pair of options that
// constrain each other; only explicit values that contradict each other
// are an error, and it names both fields and both values as written.
func TestDefaultsYieldToEveryExplicitValue(t *testing.T) {
	const kib, mib = 1 << 10, 1 << 20
	for _, tc := range []struct {
		name string
		opts Options
		want func(t *testing.T, cfg *config) // accepted: the values in force
		err  string                          // rejected: the error after `handler "x": `
	}{
		// AttemptTimeout and TotalTimeout.
		{name: "explicit attempt above the default total", opts: Options{AttemptTimeout: 40 * time.Second},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 40*time.Second, cfg.AttemptTimeout)
				assert.Equal(t, 120*time.Second, cfg.TotalTimeout, "three attempt timeouts, as the defaults hold")
				assert.Equal(t, 80*time.Second, cfg.CircuitBreaker.SamplingDuration)
			}},
		{name: "explicit attempt under the default total", opts: Options{AttemptTimeout: 15 * time.Second},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 45*time.Second, cfg.TotalTimeout, "30s, or three attempt timeouts if longer")
			}},
		{name: "explicit short attempt", opts: Options{AttemptTimeout: time.Second},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, defaultTotalTimeout, cfg.TotalTimeout) }},
		{name: "attempt timeout off", opts: Options{AttemptTimeout: -1},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, defaultTotalTimeout, cfg.TotalTimeout) }},
		{name: "huge attempt", opts: Options{AttemptTimeout: math.MaxInt64},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, time.Duration(math.MaxInt64), cfg.TotalTimeout, "saturated, not overflowed")
				assert.Equal(t, time.Duration(math.MaxInt64), cfg.CircuitBreaker.SamplingDuration)
			}},
		{name: "explicit total under the default attempt", opts: Options{TotalTimeout: 5 * time.Second},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 5*time.Second, cfg.AttemptTimeout) }},
		{name: "explicit attempt above explicit total", opts: Options{AttemptTimeout: 40 * time.Second, TotalTimeout: 30 * time.Second},
			err: "invalid option AttemptTimeout (40s): must not exceed TotalTimeout (30s)"},

		// CircuitBreaker.SamplingDuration and AttemptTimeout.
		{name: "explicit sampling under twice the default attempt", opts: Options{CircuitBreaker: CircuitBreakerOptions{SamplingDuration: 4 * time.Second}},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 2*time.Second, cfg.AttemptTimeout, "half the window")
				assert.Equal(t, defaultTotalTimeout, cfg.TotalTimeout)
			}},
		{name: "explicit sampling and total", opts: Options{TotalTimeout: 3 * time.Second, CircuitBreaker: CircuitBreakerOptions{SamplingDuration: 5 * time.Second}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 2500*time.Millisecond, cfg.AttemptTimeout) }},
		{name: "explicit sampling, breaker off", opts: Options{CircuitBreaker: CircuitBreakerOptions{Disabled: true, SamplingDuration: 4 * time.Second}},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, defaultAttemptTimeout, cfg.AttemptTimeout, "nothing to contradict")
			}},
		{name: "explicit attempt above half the default sampling", opts: Options{AttemptTimeout: 20 * time.Second},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 40*time.Second, cfg.CircuitBreaker.SamplingDuration) }},
		{name: "explicit sampling under twice explicit attempt", opts: Options{AttemptTimeout: 2 * time.Second, CircuitBreaker: CircuitBreakerOptions{SamplingDuration: 3 * time.Second}},
			err: "invalid option CircuitBreaker.SamplingDuration (3s): must be at least twice AttemptTimeout (2s)"},

		// Retry.Delay and Retry.MaxDelay.
		{name: "explicit max delay under the default delay", opts: Options{Retry: RetryOptions{MaxDelay: time.Second}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, time.Second, cfg.Retry.Delay) }},
		{name: "explicit delay above the default max delay", opts: Options{Retry: RetryOptions{Delay: time.Minute}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, time.Minute, cfg.Retry.MaxDelay) }},
		{name: "explicit max delay under explicit delay", opts: Options{Retry: RetryOptions{Delay: 2 * time.Second, MaxDelay: time.Second}},
			err: "invalid option Retry.MaxDelay (1s): must not be below Retry.Delay (2s)"},

		// Hedging.MinDelay and Hedging.MaxDelay.
		{name: "explicit hedging max delay under the default min delay", opts: Options{Hedging: HedgingOptions{MaxDelay: 500 * time.Microsecond}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 500*time.Microsecond, cfg.Hedging.MinDelay) }},
		{name: "explicit hedging min delay above the default max delay", opts: Options{Hedging: HedgingOptions{MinDelay: 5 * time.Second}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 5*time.Second, cfg.Hedging.MaxDelay) }},
		{name: "explicit hedging max delay under explicit min delay", opts: Options{Hedging: HedgingOptions{MinDelay: 2 * time.Millisecond, MaxDelay: time.Millisecond}},
			err: "invalid option Hedging.MaxDelay (1ms): must not be below Hedging.MinDelay (2ms)"},

		// Overload.MinLimit, MaxLimit and InitialLimit.
		{name: "explicit max limit under the default min limit", opts: Options{Overload: OverloadOptions{MaxLimit: 4}},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 4, cfg.Overload.MinLimit)
				assert.Equal(t, 4, cfg.Overload.InitialLimit)
			}},
		{name: "explicit initial limit under the default min limit", opts: Options{Overload: OverloadOptions{InitialLimit: 3}},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 3, cfg.Overload.MinLimit)
				assert.Equal(t, defaultOverloadMaxLimit, cfg.Overload.MaxLimit)
			}},
		{name: "explicit initial limit above the default max limit", opts: Options{Overload: OverloadOptions{InitialLimit: 5000}},
			want: func(t *testing.T, cfg *config) { assert.Equal(t, 5000, cfg.Overload.MaxLimit) }},
		{name: "explicit min limit above the default max limit", opts: Options{Overload: OverloadOptions{MinLimit: 2000}},
			want: func(t *testing.T, cfg *config) {
				assert.Equal(t, 2000, cfg.Overload.MaxLimit)
				assert.Equal(t, 2000, cfg.Overload.InitialLimit)
			}},
		{name: "explicit min limit above explicit max limit", opts: Options{Overload: OverloadOptions{MinLimit: 50, MaxLimit: 10}},
			err: "invalid option Overload.MinLimit (50): must not exceed Overload.MaxLimit (10)"},
		{name: "explicit initial limit under explicit min limit", opts: Options{Overload: OverloadOptions{MinLimit: 10, InitialLimit: 5}},
			err: "invalid option Overload.InitialLimit (5): must not be below Overload.MinLimit (10)"},
		{name: "explicit initial limit above explicit max limit", opts: Options{Overload: OverloadOptions{MaxLimit: 10, InitialLimit: 50}},
			err: "invalid option Overload.InitialLimit (50): must not exceed Overload.MaxLimit (10)"},
		{name: "explicit initial limit beyond the largest", opts: Options{Overload: OverloadOptions{InitialLimit: 2_000_000}},
			err: "invalid option Overload.InitialLimit (2000000): must be at most 1000000"},

		// Fallback.MaxEntryBytes and Fallback.MaxBytes.
		{name: "explicit store bound under the default entry bound", opts: Options{Fallback: FallbackOptions{MaxBytes: 512 * kib}},
			want: func(t *testing.T, cfg *config) { assert.EqualValues(t, 512*kib, cfg.Fallback.MaxEntryBytes) }},
		{name: "explicit entry bound above the default store bound", opts: Options{Fallback: FallbackOptions{MaxEntryBytes: 100 * mib}},
			want: func(t *testing.T, cfg *config) { assert.EqualValues(t, 100*mib, cfg.Fallback.MaxBytes) }},
		{name: "explicit entry bound above explicit store bound", opts: Options{Fallback: FallbackOptions{MaxEntryBytes: 2048, MaxBytes: 1024}},
			err: "invalid option Fallback.MaxEntryBytes (2048): must not exceed Fallback.MaxBytes (1024)"},

		// Propagation.Headers: a default name cannot yield (there is no
		// other name to take), so the error names the field written.
		{name: "explicit budget field named as the default attempt field", opts: Options{Propagation: PropagationOptions{Headers: server.Headers{Budget: "Request-Attempt"}}},
			err: `invalid option Propagation.Headers.Budget ("Request-Attempt"): the default name of Attempt; give Attempt another`},
		{name: "explicit attempt field named as the default budget field", opts: Options{Propagation: PropagationOptions{Headers: server.Headers{Attempt: "request-budget-ms"}}},
			err: `invalid option Propagation.Headers.Attempt ("request-budget-ms"): the default name of Budget; give Budget another`},
		{name: "explicit attempt field named as explicit budget field", opts: Options{Propagation: PropagationOptions{Headers: server.Headers{Budget: "X-B", Attempt: "x-b"}}},
			err: `invalid option Propagation.Headers.Attempt ("x-b"): the same field as Budget ("X-B")`},

		// PerHost.MaxHosts and Endpoints: the default (1000) holds the
		// most endpoints there can be (16).
		{name: "explicit max hosts under explicit endpoints", opts: Options{PerHost: PerHostOptions{MaxHosts: 1}, Endpoints: []Endpoint{{URL: "http://a.invalid"}, {URL: "http://b.invalid"}}},
			err: "invalid option PerHost.MaxHosts (1): must hold every endpoint (2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Name = "x"
			h, err := NewHandler(tc.opts)
			if tc.err != "" {
				require.Error(t, err)
				assert.Equal(t, `resilience: handler "x": `+tc.err, err.Error())
				return
			}
			require.NoError(t, err)
			tc.want(t, h.cfg.Load())
		})
	}
}

// The same rules hold in a configuration file, whose errors use its names.
func TestDefaultsYieldInConfig(t *testing.T) {
	c, err := LoadConfig(strings.NewReader(`{"upstreams": {
	  "slow": {"attemptTimeout": "40s"},
	  "small": {"overload": {"maxLimit": 4}, "fallback": {"maxBytes": 1024}}
	}}`))
	require.NoError(t, err)
	slow, err := NewHandler(c.Upstreams["slow"])
	require.NoError(t, err)
	assert.Equal(t, 120*time.Second, slow.Options().TotalTimeout)
	small, err := NewHandler(c.Upstreams["small"])
	require.NoError(t, err)
	assert.Equal(t, 4, small.Options().Overload.MinLimit)
	assert.EqualValues(t, 1024, small.Options().Fallback.MaxEntryBytes)

	for _, tc := range []struct{ json, want string }{
		{`{"attemptTimeout": "40s", "totalTimeout": "30s"}`, `upstreams.a.attemptTimeout (40s): must not exceed totalTimeout (30s)`},
		{`{"overload": {"minLimit": 50, "maxLimit": 10}}`, `upstreams.a.overload.minLimit (50): must not exceed overload.maxLimit (10)`},
		{`{"fallback": {"maxEntryBytes": 2048, "maxBytes": 1024}}`, `upstreams.a.fallback.maxEntryBytes (2048): must not exceed fallback.maxBytes (1024)`},
		{`{"propagation": {"headers": {"budget": "Foo-Bar", "attempt": "foo-bar"}}}`,
			`upstreams.a.propagation.headers.attempt ("foo-bar"): the same field as budget ("Foo-Bar")`},
	} {
		_, err := LoadConfig(strings.NewReader(`{"upstreams": {"a": ` + tc.json + `}}`))
		require.Error(t, err, tc.json)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// Handler.Options fills every default in; given back to Update with one
// field changed, the fields left as they were stay defaults, and yield as
// NewHandler's do, instead of contradicting the field changed.
func TestDefaultsYieldOnUpdate(t *testing.T) {
	h, err := NewHandler(Options{Name: "x"})
	require.NoError(t, err)

	o := h.Options()
	o.AttemptTimeout = 40 * time.Second
	require.NoError(t, h.Update(o), "the 30s total was a default")
	assert.Equal(t, 120*time.Second, h.Options().TotalTimeout)
	assert.Equal(t, 80*time.Second, h.Options().CircuitBreaker.SamplingDuration)

	o = h.Options()
	o.AttemptTimeout = 5 * time.Second
	require.NoError(t, h.Update(o))
	assert.Equal(t, defaultTotalTimeout, h.Options().TotalTimeout, "the defaults follow the new attempt timeout")
	assert.Equal(t, defaultSamplingDuration, h.Options().CircuitBreaker.SamplingDuration)

	o = h.Options()
	o.Overload.MaxLimit = 4
	o.Fallback.MaxBytes = 1024
	require.NoError(t, h.Update(o))
	assert.Equal(t, 4, h.Options().Overload.MinLimit)
	assert.EqualValues(t, 1024, h.Options().Fallback.MaxEntryBytes)

	o = h.Options()
	o.TotalTimeout, o.AttemptTimeout = 20*time.Second, 40*time.Second
	assert.EqualError(t, h.Update(o), `resilience: handler "x": invalid option AttemptTimeout (40s): must not exceed TotalTimeout (20s)`,
		"both written")

	// A reloaded file is as written: what it leaves out is a default.
	hs, err := Config{Upstreams: map[string]Options{"a": {}}}.Handlers(nil)
	require.NoError(t, err)
	ch, err := hs.Apply(Config{Upstreams: map[string]Options{"a": {AttemptTimeout: 40 * time.Second}}}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"totalTimeout", "circuitBreaker.samplingDuration", "attemptTimeout"}, ch.Changed["a"])
}

// A per-request attempt timeout raises a default total timeout as an
// Options one does: the attempt's budget, as the deadline contract sends
// it, is the whole attempt timeout, not what a 30s total left of it.
func TestDefaultsYieldPerRequest(t *testing.T) {
	var budgets []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		budgets = append(budgets, r.Header.Get("Request-Budget-Ms"))
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	})
	send := func(o Options, ctx context.Context) int {
		budgets = nil
		tr, err := NewTransport(base, o)
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://up.invalid/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Len(t, budgets, 1)
		ms, err := strconv.Atoi(budgets[0])
		require.NoError(t, err)
		return ms
	}
	prop := PropagationOptions{Enabled: true}
	ctx := WithAttemptTimeout(context.Background(), 40*time.Second)

	ms := send(Options{Propagation: prop}, ctx)
	assert.InDelta(t, 40_000, ms, 1_000, "the default total rose to hold the attempt")

	ms = send(Options{Propagation: prop, TotalTimeout: 30 * time.Second}, ctx)
	assert.InDelta(t, 30_000, ms, 1_000, "an explicit total still bounds it")

	ms = send(Options{Propagation: prop}, WithTotalTimeout(ctx, 20*time.Second))
	assert.InDelta(t, 20_000, ms, 1_000, "and so does a per-request one")
}

// roundTripFunc is a base RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
