package otelresilience_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/otelresilience"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// breaker opens after two attempts of which at least one failed, and stays
// open for the rest of the test.
var breaker = resilience.CircuitBreakerOptions{
	FailureRatio:      0.5,
	MinimumThroughput: 2,
	SamplingDuration:  time.Minute,
	BreakDuration:     time.Hour,
}

// newHandler builds an instrumented, observed handler and a client on it.
func (r *rig) newHandler(t *testing.T, opts resilience.Options) (*resilience.Handler, *http.Client) {
	t.Helper()
	h, err := resilience.NewHandler(r.m.Instrument(opts))
	require.NoError(t, err)
	require.NoError(t, r.m.Observe(h))
	tr := h.Transport(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)
	return h, &http.Client{Transport: tr}
}

// 503, 503, 200: two retries, three attempts, one call.
func TestScriptedRetries(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 503, 503, 200)
	var seen atomic.Int64
	_, c := r.newHandler(t, resilience.Options{
		Name:    "pricing",
		Retry:   resilience.RetryOptions{Delay: time.Millisecond},
		OnEvent: func(resilience.Event) { seen.Add(1) },
	})

	status, err := get(t, c, up.URL)
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.EqualValues(t, 3, up.hits.Load())

	pricing := attrs{"resilience.handler": "pricing", "http.request.method": "GET"}
	assert.ElementsMatch(t, []point{
		{pricing.with(attrs{"resilience.event": "retry", "http.response.status_code": int64(503)}), 2},
	}, r.events(t), "exactly two retries, nothing else")
	assert.ElementsMatch(t, []point{
		{pricing.with(attrs{"resilience.attempt": int64(1), "resilience.outcome": "failure", "http.response.status_code": int64(503)}), 1},
		{pricing.with(attrs{"resilience.attempt": int64(2), "resilience.outcome": "failure", "http.response.status_code": int64(503)}), 1},
		{pricing.with(attrs{"resilience.attempt": int64(3), "resilience.outcome": "success", "http.response.status_code": int64(200)}), 1},
	}, r.histogram(t, "resilience.attempt.duration"), "exactly three attempts")
	assert.ElementsMatch(t, []point{
		{pricing.with(attrs{"resilience.outcome": "success", "http.response.status_code": int64(200)}), 1},
	}, r.histogram(t, "resilience.call.duration"), "exactly one call")
	assert.ElementsMatch(t, []point{
		{attrs{"resilience.handler": "pricing"}, int64(resilience.CircuitClosed)},
	}, r.gauge(t))
	assert.EqualValues(t, 2+3+1, seen.Load(), "Instrument keeps the OnEvent already set: 2 retries, 3 attempts, 1 call")
}

// A circuit that opens is counted and read as open; the call it rejects
// is counted too.
func TestCircuitOpenAndRejected(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 500)
	h, c := r.newHandler(t, resilience.Options{
		Name:           "carrier",
		Retry:          resilience.RetryOptions{Disabled: true},
		CircuitBreaker: breaker,
	})

	for range 2 {
		status, err := get(t, c, up.URL)
		require.NoError(t, err)
		require.Equal(t, 500, status)
	}
	require.Equal(t, resilience.CircuitOpen, h.CircuitState())
	_, err := get(t, c, up.URL)
	require.ErrorIs(t, err, resilience.ErrCircuitOpen)
	require.EqualValues(t, 2, up.hits.Load())

	carrier := attrs{"resilience.handler": "carrier"}
	get := carrier.with(attrs{"http.request.method": "GET"})
	assert.ElementsMatch(t, []point{
		{carrier.with(attrs{"resilience.event": "circuit_opened"}), 1},
		{get.with(attrs{"resilience.event": "circuit_rejected"}), 1},
	}, r.events(t))
	assert.ElementsMatch(t, []point{
		{get.with(attrs{"resilience.attempt": int64(1), "resilience.outcome": "failure", "http.response.status_code": int64(500)}), 2},
	}, r.histogram(t, "resilience.attempt.duration"), "the rejected call made no attempt")
	assert.ElementsMatch(t, []point{
		{get.with(attrs{"resilience.outcome": "failure", "http.response.status_code": int64(500)}), 2},
		{get.with(attrs{"resilience.outcome": "rejected", "error.type": "circuit_open"}), 1},
	}, r.histogram(t, "resilience.call.duration"))
	assert.ElementsMatch(t, []point{{carrier, int64(resilience.CircuitOpen)}}, r.gauge(t), "the gauge reads 2, open")
}

// An isolated circuit reads 3, and its events say "isolated".
func TestIsolation(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 200)
	h, c := r.newHandler(t, resilience.Options{Name: "search"})

	h.IsolateCircuit()
	assert.ElementsMatch(t, []point{{attrs{"resilience.handler": "search"}, int64(resilience.CircuitIsolated)}}, r.gauge(t))
	_, err := get(t, c, up.URL)
	require.ErrorIs(t, err, resilience.ErrCircuitOpen)
	h.CloseCircuit()

	search := attrs{"resilience.handler": "search"}
	get := search.with(attrs{"http.request.method": "GET"})
	assert.ElementsMatch(t, []point{
		{search.with(attrs{"resilience.event": "circuit_opened", "error.type": "isolated"}), 1},
		{get.with(attrs{"resilience.event": "circuit_rejected", "error.type": "isolated"}), 1},
		{search.with(attrs{"resilience.event": "circuit_closed"}), 1},
	}, r.events(t))
	assert.ElementsMatch(t, []point{
		{get.with(attrs{"resilience.outcome": "rejected", "error.type": "circuit_open"}), 1},
	}, r.histogram(t, "resilience.call.duration"))
	assert.ElementsMatch(t, []point{{search, int64(resilience.CircuitClosed)}}, r.gauge(t))
	assert.Zero(t, up.hits.Load())
}

// A PerHost handler reports every host's circuit, and its measurements
// name the host.
func TestPerHost(t *testing.T) {
	bad, good := newUpstream(t, 500), newUpstream(t, 200)
	opts := resilience.Options{
		Name:           "fleet",
		Retry:          resilience.RetryOptions{Disabled: true},
		CircuitBreaker: breaker,
		PerHost:        resilience.PerHostOptions{Enabled: true},
	}
	fleet := attrs{"resilience.handler": "fleet"}
	badHost, goodHost := fleet.with(bad.hostAttrs(t)), fleet.with(good.hostAttrs(t))

	run := func(t *testing.T, r *rig) {
		t.Helper()
		_, c := r.newHandler(t, opts)
		for range 2 {
			_, err := get(t, c, bad.URL)
			require.NoError(t, err)
		}
		_, err := get(t, c, bad.URL)
		require.ErrorIs(t, err, resilience.ErrCircuitOpen)
		status, err := get(t, c, good.URL)
		require.NoError(t, err, "the good host's circuit is closed")
		require.Equal(t, 200, status)
	}

	t.Run("hosts", func(t *testing.T) {
		r := newRig(t)
		run(t, r)
		assert.ElementsMatch(t, []point{
			{fleet, int64(resilience.CircuitOpen)}, // the least healthy host
			{badHost, int64(resilience.CircuitOpen)},
			{goodHost, int64(resilience.CircuitClosed)},
		}, r.gauge(t))
		assert.ElementsMatch(t, []point{
			{badHost.with(attrs{"resilience.event": "circuit_opened"}), 1},
			{badHost.with(attrs{"resilience.event": "circuit_rejected", "http.request.method": "GET"}), 1},
		}, r.events(t))
		assert.ElementsMatch(t, []point{
			{badHost.with(attrs{"http.request.method": "GET", "resilience.attempt": int64(1), "resilience.outcome": "failure", "http.response.status_code": int64(500)}), 2},
			{goodHost.with(attrs{"http.request.method": "GET", "resilience.attempt": int64(1), "resilience.outcome": "success", "http.response.status_code": int64(200)}), 1},
		}, r.histogram(t, "resilience.attempt.duration"))
	})

	t.Run("without host attributes", func(t *testing.T) {
		r := newRig(t, otelresilience.WithHostAttributes(false))
		run(t, r)
		assert.ElementsMatch(t, []point{{fleet, int64(resilience.CircuitOpen)}}, r.gauge(t))
		assert.ElementsMatch(t, []point{
			{fleet.with(attrs{"resilience.event": "circuit_opened"}), 1},
			{fleet.with(attrs{"resilience.event": "circuit_rejected", "http.request.method": "GET"}), 1},
		}, r.events(t))
	})
}

// A call refused by admission control is counted, and its call is
// "rejected".
func TestRateLimited(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 200)
	_, c := r.newHandler(t, resilience.Options{
		Name:      "ledger",
		RateLimit: resilience.RateLimitOptions{MaxConcurrent: 1},
	})

	held, err := c.Get(up.URL) // its permit is held until its body is closed
	require.NoError(t, err)
	_, err = get(t, c, up.URL)
	require.ErrorIs(t, err, resilience.ErrRateLimited)
	held.Body.Close()

	get := attrs{"resilience.handler": "ledger", "http.request.method": "GET"}
	assert.ElementsMatch(t, []point{{get.with(attrs{"resilience.event": "rate_limited"}), 1}}, r.events(t))
	assert.ElementsMatch(t, []point{
		{get.with(attrs{"resilience.outcome": "success", "http.response.status_code": int64(200)}), 1},
		{get.with(attrs{"resilience.outcome": "rejected", "error.type": "rate_limited"}), 1},
	}, r.histogram(t, "resilience.call.duration"))
}

// An attempt that times out is counted, and both its attempt and its call
// are "timeout".
func TestAttemptTimeout(t *testing.T) {
	r := newRig(t)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // until the attempt is given up
	}))
	t.Cleanup(hang.Close)
	_, c := r.newHandler(t, resilience.Options{
		Name:                 "slow",
		AttemptTimeout:       20 * time.Millisecond,
		StrictAttemptTimeout: true, // one call alone: nothing overtakes it
		Retry:                resilience.RetryOptions{Disabled: true},
	})

	_, err := get(t, c, hang.URL)
	require.ErrorIs(t, err, resilience.ErrAttemptTimeout)

	get := attrs{"resilience.handler": "slow", "http.request.method": "GET"}
	timeout := attrs{"error.type": "attempt_timeout"}
	assert.ElementsMatch(t, []point{{get.with(timeout).with(attrs{"resilience.event": "attempt_timeout"}), 1}}, r.events(t))
	assert.ElementsMatch(t, []point{
		{get.with(timeout).with(attrs{"resilience.attempt": int64(1), "resilience.outcome": "timeout"}), 1},
	}, r.histogram(t, "resilience.attempt.duration"))
	assert.ElementsMatch(t, []point{
		{get.with(timeout).with(attrs{"resilience.outcome": "timeout"}), 1},
	}, r.histogram(t, "resilience.call.duration"))
}

// The error a Transport returns is typed by its cause, under the
// handler's and net/http's wrappers.
func TestCallErrorTypes(t *testing.T) {
	r := newRig(t)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // nothing listens: the dial is refused
	_, c := r.newHandler(t, resilience.Options{Name: "gone", Retry: resilience.RetryOptions{Disabled: true}})

	_, err := get(t, c, closed.URL)
	var op *net.OpError
	require.ErrorAs(t, err, &op)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, closed.URL, nil)
	require.NoError(t, err)
	_, err = c.Do(req)
	require.ErrorIs(t, err, context.Canceled)

	gone := attrs{"resilience.handler": "gone", "http.request.method": "GET"}
	calls := r.histogram(t, "resilience.call.duration")
	assert.Contains(t, calls, point{gone.with(attrs{"resilience.outcome": "failure", "error.type": "*net.OpError"}), 1})
	assert.Contains(t, calls, point{gone.with(attrs{"resilience.outcome": "canceled", "error.type": "canceled"}), 1})
	assert.Len(t, calls, 2)
}

// Errors and statuses of events map to the documented error types and
// outcomes.
func TestErrorTypesAndOutcomes(t *testing.T) {
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	cases := []struct {
		status  int
		err     error
		errType string // "" for none
		outcome string
	}{
		{200, nil, "", "success"},
		{404, nil, "", "success"},
		{501, nil, "", "success"},
		{429, nil, "", "failure"},
		{503, nil, "", "failure"},
		{0, resilience.ErrAttemptTimeout, "attempt_timeout", "timeout"},
		{0, resilience.ErrTotalTimeout, "total_timeout", "timeout"},
		{0, context.Canceled, "canceled", "canceled"},
		{0, fmt.Errorf("reading: %w", context.DeadlineExceeded), "deadline_exceeded", "timeout"},
		{0, &url.Error{Op: "Get", URL: "http://x", Err: dialTimeout}, "timeout", "timeout"},
		{0, &url.Error{Op: "Get", URL: "http://x", Err: refused}, "*net.OpError", "failure"},
		{0, refused, "*net.OpError", "failure"},
		{0, errors.New("boom"), "*errors.errorString", "failure"},
		{0, resilience.ErrCircuitOpen, "circuit_open", "failure"}, // an attempt is never rejected
	}
	r := newRig(t)
	var want []point
	for i, tc := range cases {
		e := resilience.Event{Kind: resilience.EventAttempt, Handler: "h", Attempt: i + 1, StatusCode: tc.status, Err: tc.err, Duration: time.Millisecond}
		r.m.OnEvent(e)
		a := attrs{"resilience.handler": "h", "resilience.attempt": int64(i + 1), "resilience.outcome": tc.outcome}
		if tc.status != 0 {
			a["http.response.status_code"] = int64(tc.status)
		}
		if tc.errType != "" {
			a["error.type"] = tc.errType
		}
		want = append(want, point{a, 1})
	}
	assert.ElementsMatch(t, want, r.histogram(t, "resilience.attempt.duration"))
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// Methods outside the standard nine are "_OTHER", so that a client cannot
// grow the series without end.
func TestMethods(t *testing.T) {
	r := newRig(t)
	for _, m := range []string{"GET", "PATCH", "PURGE", "get", "X-SECRET-1", "X-SECRET-2"} {
		r.m.OnEvent(resilience.Event{Kind: resilience.EventRetry, Handler: "h", Method: m, StatusCode: 503})
	}
	h := attrs{"resilience.handler": "h", "resilience.event": "retry", "http.response.status_code": int64(503)}
	assert.ElementsMatch(t, []point{
		{h.with(attrs{"http.request.method": "GET"}), 1},
		{h.with(attrs{"http.request.method": "PATCH"}), 1},
		{h.with(attrs{"http.request.method": "_OTHER"}), 4},
	}, r.events(t))
}

// Hosts of every form give the host attributes.
func TestHostAttributes(t *testing.T) {
	r := newRig(t)
	for _, host := range []string{"https://api.example.com", "http://api.example.com", "http://10.0.0.1:8080", "https://[::1]:8443", "https://[::1]"} {
		r.m.OnEvent(resilience.Event{Kind: resilience.EventCircuitClosed, Handler: "h", Host: host})
	}
	h := attrs{"resilience.handler": "h", "resilience.event": "circuit_closed"}
	assert.ElementsMatch(t, []point{
		{h.with(attrs{"server.address": "api.example.com", "server.port": int64(443), "url.scheme": "https"}), 1},
		{h.with(attrs{"server.address": "api.example.com", "server.port": int64(80), "url.scheme": "http"}), 1},
		{h.with(attrs{"server.address": "10.0.0.1", "server.port": int64(8080), "url.scheme": "http"}), 1},
		{h.with(attrs{"server.address": "::1", "server.port": int64(8443), "url.scheme": "https"}), 1},
		{h.with(attrs{"server.address": "::1", "server.port": int64(443), "url.scheme": "https"}), 1},
	}, r.events(t))
}

// More attribute combinations than the cache keeps are still all counted.
func TestManyCombinations(t *testing.T) {
	r := newRig(t)
	const n = 5000
	for round := range 2 {
		for i := range n {
			r.m.OnEvent(resilience.Event{Kind: resilience.EventRetry, Handler: "h", Host: fmt.Sprintf("http://h%d:80", i), StatusCode: 503})
		}
		var total int64
		for _, p := range r.events(t) {
			total += p.Value
		}
		assert.EqualValues(t, (round+1)*n, total, "round %d", round)
	}
}

func TestNewErrors(t *testing.T) {
	_, err := otelresilience.New(nil)
	require.EqualError(t, err, "otelresilience: nil MeterProvider")
	m, err := otelresilience.New(noop.NewMeterProvider(), nil)
	require.NoError(t, err, "a nil Option is ignored")
	require.NoError(t, m.Close())
}

func TestObserve(t *testing.T) {
	r := newRig(t)
	a1, err := resilience.NewHandler(resilience.Options{Name: "a"})
	require.NoError(t, err)
	a2, err := resilience.NewHandler(resilience.Options{Name: "a"})
	require.NoError(t, err)
	b, err := resilience.NewHandler(resilience.Options{Name: "b"})
	require.NoError(t, err)

	require.NoError(t, r.m.Observe(a1, a1))
	require.NoError(t, r.m.Observe(a1), "observing a handler again does nothing")
	err = r.m.Observe(b, a2)
	require.EqualError(t, err, `otelresilience: Observe: another handler named "a" is already observed`)
	err = r.m.Observe(b, nil)
	require.EqualError(t, err, "otelresilience: Observe: handler 1 is nil")
	assert.ElementsMatch(t, []point{{attrs{"resilience.handler": "a"}, 0}}, r.gauge(t), "a failed Observe adds none")

	r.m.Unobserve(a1)
	require.NoError(t, r.m.Observe(a2, b), "a reload replaces the handler of a name")
	a2.IsolateCircuit()
	assert.ElementsMatch(t, []point{
		{attrs{"resilience.handler": "a"}, int64(resilience.CircuitIsolated)},
		{attrs{"resilience.handler": "b"}, 0},
	}, r.gauge(t))

	require.NoError(t, r.m.Close())
	require.NoError(t, r.m.Close(), "Close is idempotent")
	assert.Empty(t, r.gauge(t), "a closed Metrics reports no state")
	err = r.m.Observe(b)
	require.EqualError(t, err, "otelresilience: Observe after Close")
	r.m.OnEvent(resilience.Event{Kind: resilience.EventRetry, Handler: "a"})
	assert.Len(t, r.events(t), 1, "OnEvent outlives Close")
}

func TestInstrument(t *testing.T) {
	r := newRig(t)
	opts := r.m.Instrument(resilience.Options{Name: "x"})
	require.NotNil(t, opts.OnEvent)
	opts.OnEvent(resilience.Event{Kind: resilience.EventRetry, Handler: "x"})
	assert.ElementsMatch(t, []point{{attrs{"resilience.handler": "x", "resilience.event": "retry"}, 1}}, r.events(t))
}

// Events, observations and collections may all run at once.
func TestConcurrent(t *testing.T) {
	r := newRig(t)
	const workers, each = 8, 500
	var wg sync.WaitGroup
	wg.Add(workers + 1)
	for w := range workers {
		go func() {
			defer wg.Done()
			h, err := resilience.NewHandler(resilience.Options{Name: fmt.Sprintf("h%d", w)})
			if !assert.NoError(t, err) {
				return
			}
			assert.NoError(t, r.m.Observe(h))
			for i := range each {
				r.m.OnEvent(resilience.Event{Kind: resilience.EventAttempt, Handler: h.Name(), Method: "GET", Attempt: 1 + i%3, StatusCode: 200 + i%2*300, Duration: time.Millisecond})
				if i%100 == 0 {
					r.m.Unobserve(h)
					assert.NoError(t, r.m.Observe(h))
				}
			}
		}()
	}
	go func() {
		defer wg.Done()
		for range 20 {
			r.gauge(t)
		}
	}()
	wg.Wait()
	var total int64
	for _, p := range r.histogram(t, "resilience.attempt.duration") {
		total += p.Value
		assert.True(t, strings.HasPrefix(p.Attrs["resilience.handler"].(string), "h"))
	}
	assert.EqualValues(t, workers*each, total)
	assert.Len(t, r.gauge(t), workers)
}

// Every hedge is counted, and every attempt of a hedged call is measured:
// the slow first attempt (cancelled by the race) and the hedge that won.
func TestHedgesCounted(t *testing.T) {
	r := newRig(t)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if hits.Add(1) == 1 {
			<-req.Context().Done() // the first attempt is stuck until it loses
			return
		}
		fmt.Fprint(w, "fast")
	}))
	t.Cleanup(srv.Close)
	_, c := r.newHandler(t, resilience.Options{
		Name:    "catalog",
		Hedging: resilience.HedgingOptions{Enabled: true, Delay: 10 * time.Millisecond},
	})

	status, err := get(t, c, srv.URL)
	require.NoError(t, err)
	require.Equal(t, 200, status)

	catalog := attrs{"resilience.handler": "catalog", "http.request.method": "GET"}
	assert.ElementsMatch(t, []point{
		{catalog.with(attrs{"resilience.event": "hedge"}), 1},
	}, r.events(t), "one hedge, counted")
	// The loser reports from its own goroutine once cancelled, after the
	// call has returned.
	require.Eventually(t, func() bool { return len(r.histogram(t, "resilience.attempt.duration")) == 2 },
		5*time.Second, time.Millisecond, "both attempts measured, by number")
	assert.ElementsMatch(t, []point{
		{catalog.with(attrs{"resilience.outcome": "success", "http.response.status_code": int64(200)}), 1},
	}, r.histogram(t, "resilience.call.duration"))
}

// A retry the budget refuses is counted as a budget_exceeded event whose
// error.type says why: the budget is exhausted.
func TestBudgetExceeded(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 503)
	_, c := r.newHandler(t, resilience.Options{
		Name:           "ledger",
		Retry:          resilience.RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true},
		RetryBudget:    resilience.RetryBudgetOptions{MaxTokens: 1},
		CircuitBreaker: resilience.CircuitBreakerOptions{Disabled: true},
	})
	for range 2 { // the first call's retry fails and takes the only token
		status, err := get(t, c, up.URL)
		require.NoError(t, err)
		assert.Equal(t, 503, status)
	}
	get := attrs{"resilience.handler": "ledger", "http.request.method": "GET", "http.response.status_code": int64(503)}
	assert.ElementsMatch(t, []point{
		{get.with(attrs{"resilience.event": "retry"}), 1},
		{get.with(attrs{"resilience.event": "budget_exceeded", "error.type": "budget_exhausted"}), 1},
		// the budget's change of state, once, about no one call
		{attrs{"resilience.handler": "ledger", "resilience.event": "budget_exhausted", "error.type": "budget_exhausted"}, 1},
	}, r.events(t))
}

// Routed attempts carry their endpoint's configured base; a hedge refused by
// MaxExtraLoad is counted once per call as a hedge_capped event.
func TestEndpointsAndCappedHedges(t *testing.T) {
	r := newRig(t)
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		<-req.Context().Done()
	}))
	t.Cleanup(stuck.Close)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "ok") }))
	t.Cleanup(fast.Close)
	_, c := r.newHandler(t, resilience.Options{
		Name:      "orders",
		PerHost:   resilience.PerHostOptions{Enabled: true},
		Hedging:   resilience.HedgingOptions{Enabled: true, Delay: 5 * time.Millisecond},
		Endpoints: []resilience.Endpoint{{URL: stuck.URL}, {URL: fast.URL}},
	})
	status, err := get(t, c, "http://orders.invalid/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Eventually(t, func() bool { return len(r.histogram(t, "resilience.attempt.duration")) == 2 },
		5*time.Second, time.Millisecond, "both attempts measured")
	var endpoints []any
	for _, p := range r.histogram(t, "resilience.attempt.duration") {
		endpoints = append(endpoints, p.Attrs["resilience.endpoint"])
	}
	assert.ElementsMatch(t, []any{stuck.URL, fast.URL}, endpoints)

	// The one hedge the window's reserve allows is spent: the next call's
	// hedge is refused, and counted.
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://orders.invalid/", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-done
	var capped int64
	for _, p := range r.events(t) {
		if p.Attrs["resilience.event"] == "hedge_capped" {
			capped += p.Value
		}
	}
	assert.EqualValues(t, 1, capped)
}

// The overload limiter's limit is a gauge per handler whose limiter is on.
func TestOverloadLimitGauge(t *testing.T) {
	r := newRig(t)
	on, err := resilience.NewHandler(resilience.Options{Name: "on",
		Overload: resilience.OverloadOptions{MinLimit: 3, InitialLimit: 5}})
	require.NoError(t, err)
	off, err := resilience.NewHandler(resilience.Options{Name: "off", Overload: resilience.OverloadOptions{Disabled: true}})
	require.NoError(t, err)
	require.NoError(t, r.m.Observe(on, off))
	m, ok := r.collect(t)["resilience.overload.limit"]
	require.True(t, ok)
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok)
	assert.Equal(t, []point{{attrs{"resilience.handler": "on"}, 5}}, points(g.DataPoints))
}
