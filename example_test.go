package resilience_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience"
)

// A flaky upstream: the first two requests get 503, the rest 200.
func flakyUpstream() (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "hello")
	}))
	return srv, &calls
}

func ExampleNewTransport() {
	upstream, calls := flakyUpstream()
	defer upstream.Close()

	// The zero Options is the standard handler; here the delays are shortened.
	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry: resilience.RetryOptions{Delay: 10 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	resp, err := client.Get(upstream.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", calls.Load(), "attempts")
	// Output: 200 hello after 3 attempts
}

// One Handler per upstream, shared by every client that calls it: they share
// its circuit breaker and its concurrency limit.
func ExampleHandler_Transport() {
	upstream, _ := flakyUpstream()
	defer upstream.Close()

	pricing, err := resilience.NewHandler(resilience.Options{
		Name:           "pricing",
		AttemptTimeout: 2 * time.Second,
		Retry:          resilience.RetryOptions{Delay: 10 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	checkout := &http.Client{Transport: pricing.Transport(nil)}
	catalog := &http.Client{Transport: pricing.Transport(nil)}
	defer checkout.CloseIdleConnections()

	for _, c := range []*http.Client{checkout, catalog} {
		resp, err := c.Get(upstream.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(pricing.Name(), resp.StatusCode)
	}

	// Manual control, for a known maintenance window.
	pricing.IsolateCircuit()
	_, err = catalog.Get(upstream.URL)
	fmt.Println(pricing.CircuitState(), errors.Is(err, resilience.ErrCircuitOpen))
	pricing.CloseCircuit()
	fmt.Println(pricing.CircuitState())
	// Output:
	// pricing 200
	// pricing 200
	// isolated true
	// closed
}

// By default only GET is retried. Methods widens the set; ExcludeMethods
// narrows it, here so that even GETs to an upstream with side effects on
// read are sent once.
func ExampleRetryOptions_excludeMethods() {
	upstream, calls := flakyUpstream()
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry: resilience.RetryOptions{
			Delay:          10 * time.Millisecond,
			Methods:        []string{http.MethodPut},
			ExcludeMethods: []string{http.MethodGet},
		},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	resp, err := client.Get(upstream.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("GET:", resp.StatusCode, "after", calls.Load(), "attempt")

	req, _ := http.NewRequest(http.MethodPut, upstream.URL, bytes.NewReader([]byte("v=1")))
	resp, err = client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("PUT:", resp.StatusCode, "after", calls.Load()-1, "attempts")
	// Output:
	// GET: 503 after 1 attempt
	// PUT: 200 after 2 attempts
}

// WithRetryable lets one request of a method outside the set be retried,
// for an upstream that honours an idempotency key.
func ExampleWithRetryable() {
	upstream, calls := flakyUpstream()
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry: resilience.RetryOptions{Delay: 10 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()

	req, _ := http.NewRequest(http.MethodPost, upstream.URL, bytes.NewReader([]byte(`{"amount":100}`)))
	req.Header.Set("Idempotency-Key", "order-42")
	req = req.WithContext(resilience.WithRetryable(req.Context(), true))
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", calls.Load(), "attempts")
	// Output: 200 after 3 attempts
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, v := range []string{"120", "Sun, 29 Nov 2026 12:00:30 GMT", "soon"} {
		d, ok := resilience.ParseRetryAfter(v, now)
		fmt.Println(d, ok)
	}
	// Output:
	// 2m0s true
	// 30s true
	// 0s false
}

// A service loads its upstreams from one file and hands each client the
// handler of its upstream by name.
func ExampleLoadConfig() {
	cfg, err := resilience.LoadConfig(strings.NewReader(`{
	  "defaults": {"totalTimeout": "10s", "attemptTimeout": "2s", "retry": {"delay": "200ms"}},
	  "upstreams": {
	    "pricing": {"circuitBreaker": {"minimumThroughput": 20}},
	    "carrier": {"retry": {"methods": ["PUT"]}}
	  }
	}`))
	if err != nil {
		panic(err)
	}
	handlers, err := cfg.Handlers(func(name string, o *resilience.Options) {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)).With("upstream", name)
	})
	if err != nil {
		panic(err)
	}
	pricing, err := handlers.Transport("pricing", nil)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: pricing}
	_ = client
	fmt.Println(handlers.Names())

	_, err = handlers.Handler("billing")
	fmt.Println(err)

	_, err = resilience.LoadConfig(strings.NewReader(`{"upstreams": {"pricing": {"retry": {"delay": "2x"}}}}`))
	fmt.Println(err)
	// Output:
	// [carrier pricing]
	// resilience: no upstream "billing" (known: carrier, pricing)
	// resilience: config: upstreams.pricing.retry.delay: invalid duration "2x"
}

// With PerHost, one handler in front of many hosts gives each its own
// circuit: a failing host does not stop the calls to the others.
func ExamplePerHostOptions() {
	var bad, good = failingUpstream(), healthyUpstream()
	defer bad.Close()
	defer good.Close()

	h, err := resilience.NewHandler(resilience.Options{
		Name:    "search",
		PerHost: resilience.PerHostOptions{Enabled: true, MaxHosts: 100},
		Retry:   resilience.RetryOptions{Disabled: true},
		CircuitBreaker: resilience.CircuitBreakerOptions{
			MinimumThroughput: 5, FailureRatio: 0.5, BreakDuration: time.Minute,
		},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: h.Transport(nil)}
	defer client.CloseIdleConnections()
	for range 5 {
		if resp, err := client.Get(bad.URL); err == nil {
			resp.Body.Close()
		}
	}
	_, err = client.Get(bad.URL)
	fmt.Println("bad host:", errors.Is(err, resilience.ErrCircuitOpen))
	resp, err := client.Get(good.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("good host:", resp.StatusCode)
	// Output:
	// bad host: true
	// good host: 200
}

// One call can have its own timeouts, or be kept from retrying, without a
// handler of its own.
func ExampleWithAttemptTimeout() {
	upstream := healthyUpstream()
	defer upstream.Close()
	t, err := resilience.NewTransport(nil, resilience.Options{Name: "reports"})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()

	// A slow report: a longer attempt and total budget, and no retry.
	ctx := resilience.WithAttemptTimeout(context.Background(), 45*time.Second)
	ctx = resilience.WithTotalTimeout(ctx, 50*time.Second)
	ctx = resilience.WithRetryable(ctx, false)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/reports/2026", nil)
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output: 200
}

// A health endpoint reports each circuit, degraded (not down) while one is
// open, with the reason.
func ExampleHealthHandler() {
	pricing, _ := resilience.NewHandler(resilience.Options{Name: "pricing"})
	carrier, _ := resilience.NewHandler(resilience.Options{Name: "carrier"})
	carrier.IsolateCircuit() // a known maintenance window

	rec := httptest.NewRecorder()
	resilience.HealthHandler(pricing, carrier).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	fmt.Println(rec.Code, rec.Body.String())
	// Output: 200 {"status":"degraded","handlers":{"carrier":{"circuit":"isolated","reason":"isolated by IsolateCircuit","overload":{"limit":20,"inFlight":0,"queued":0,"latencyMs":0,"refused":0,"overloaded":false}},"pricing":{"circuit":"closed","overload":{"limit":20,"inFlight":0,"queued":0,"latencyMs":0,"refused":0,"overloaded":false}}}}
}

func failingUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
}

func healthyUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
}

// Hedging, .NET's standard hedging handler: a slow answer is overtaken by
// a hedge sent after Delay; the slow attempt is cancelled.
func ExampleHedgingOptions() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-r.Context().Done() // the first attempt is stuck until cancelled
			return
		}
		fmt.Fprint(w, "fast")
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Name:    "catalog",
		Hedging: resilience.HedgingOptions{Enabled: true, Delay: 50 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	resp, err := (&http.Client{Transport: t}).Get(upstream.URL)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body), "after", calls.Load(), "attempts")
	// Output: fast after 2 attempts
}

// The retry budget is on by default; its refusals are events. Here a dead
// upstream is called by sixteen callers at once: after five failed attempts
// the bucket is half empty, and every further retry is refused.
func ExampleRetryBudgetOptions() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer upstream.Close()

	var refused atomic.Int32
	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry:          resilience.RetryOptions{Delay: time.Millisecond},
		RetryBudget:    resilience.RetryBudgetOptions{MaxTokens: 5}, // 25 by default
		CircuitBreaker: resilience.CircuitBreakerOptions{Disabled: true},
		OnEvent: func(e resilience.Event) {
			if e.Kind == resilience.EventBudgetExceeded {
				refused.Add(1)
			}
		},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	// Ten calls to an upstream that is down: the first makes its three
	// retries, the second two before the bucket is empty, and the rest one
	// attempt each instead of four.
	for range 10 {
		if resp, err := client.Get(upstream.URL); err == nil {
			resp.Body.Close()
		}
	}
	fmt.Println("attempts:", calls.Load(), "refusals:", refused.Load())
	// Output: attempts: 15 refusals: 9
}

// A reloaded configuration applied to the running handlers: the changed
// upstream keeps its handler (and its circuit, limits and budget) and
// retries less from the next call, the new one gets a handler, and the
// removed one keeps serving whoever holds its transport.
func ExampleHandlers_Apply() {
	var attempts atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer upstream.Close()

	load := func(file string) resilience.Config {
		cfg, err := resilience.LoadConfig(strings.NewReader(file))
		if err != nil {
			panic(err)
		}
		return cfg
	}
	handlers, err := load(`{"upstreams": {
		"pricing": {"retry": {"maxRetries": 3, "delay": "1ms"}},
		"legacy":  {}
	}}`).Handlers(nil)
	if err != nil {
		panic(err)
	}
	pricing, _ := handlers.Transport("pricing", nil)
	defer pricing.CloseIdleConnections()
	get := func() {
		attempts.Store(0)
		resp, err := (&http.Client{Transport: pricing}).Get(upstream.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "after", attempts.Load(), "attempts")
	}
	get()

	changes, err := handlers.Apply(load(`{"upstreams": {
		"pricing": {"retry": {"maxRetries": 1, "delay": "1ms"}},
		"carrier": {}
	}}`), nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("added", changes.Added, "removed", changes.Removed, "changed", changes.Changed)
	get()
	// Output:
	// 503 after 4 attempts
	// added [carrier] removed [legacy] changed map[pricing:[retry.maxRetries]]
	// 503 after 2 attempts
}

// the server sends would win over it.
func ExampleRetryOptions_delayFunc() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "hello")
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry: resilience.RetryOptions{
			Delay:    20 * time.Millisecond,
			NoJitter: true,
			DelayFunc: func(d resilience.DelayInfo) time.Duration {
				if d.Response == nil {
					return 0 // d.Err says what failed
				}
				wait := d.Delay
				if d.Request.Header.Get("Priority") == "u=0" {
					wait /= 2
				}
				fmt.Printf("retry %d after %d: computed %v, waiting %v\n", d.Retry, d.Response.StatusCode, d.Delay, wait)
				return wait // a negative value would mean d.Delay
			},
		},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	req, _ := http.NewRequest(http.MethodGet, upstream.URL, nil)
	req.Header.Set("Priority", "u=0")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// retry 1 after 503: computed 20ms, waiting 10ms
	// retry 2 after 503: computed 40ms, waiting 20ms
	// 200 hello
}

// hook, asks for a Report through the request's context.
func ExampleWithReport() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Retry: resilience.RetryOptions{Delay: 10 * time.Millisecond, NoJitter: true, Backoff: resilience.BackoffConstant},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()

	var report resilience.Report
	req, err := http.NewRequestWithContext(resilience.WithReport(context.Background(), &report), http.MethodGet, upstream.URL, nil)
	if err != nil {
		panic(err)
	}
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("status:", resp.StatusCode, "attempts:", report.Attempts, "waited 20ms or more:", report.Waited >= 20*time.Millisecond, "budget refused:", report.BudgetRefused)
	// Output: status: 200 attempts: 3 waited 20ms or more: true budget refused: false
}

// Report.Outcome says why a call ended without reading the error: here a
// call the handler's own rate refused (nothing was sent: try again later,
// or elsewhere) and one whose attempt got no answer in time (the upstream
// is slow) are told apart. The String of an Outcome is the name the
// error's ErrorType gives the same failure.
func ExampleOutcome() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers in time
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		AttemptTimeout:       50 * time.Millisecond,
		StrictAttemptTimeout: true, // cut at its limit though nothing overtook it
		Retry:                resilience.RetryOptions{Disabled: true},
		RateLimit:            resilience.RateLimitOptions{RequestsPerSecond: 0.01, Burst: 1}, // one call, then one per 100s
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	for range 2 {
		var report resilience.Report
		req, err := http.NewRequestWithContext(resilience.WithReport(context.Background(), &report), http.MethodGet, upstream.URL, nil)
		if err != nil {
			panic(err)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
		switch report.Outcome {
		case resilience.OutcomeRateLimited:
			fmt.Println(report.Outcome, "- refused here, nothing sent:", report.Attempts, "attempts")
		case resilience.OutcomeAttemptTimeout:
			fmt.Println(report.Outcome, "- the upstream did not answer in time:", report.Attempts, "attempt")
		default:
			fmt.Println(report.Outcome, report.StatusCode)
		}
	}
	// Output:
	// attempt_timeout - the upstream did not answer in time: 1 attempt
	// rate_limited - refused here, nothing sent: 0 attempts
}

// Hedging across endpoints: the primary replica is stuck, so the hedge goes
// to the secondary after Delay and its answer wins; the primary's attempt
// is cancelled. The request names the upstream; each attempt's URL is the
// endpoint's base with the request's path.
func ExampleEndpoint() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // stuck until the race is lost
	}))
	defer primary.Close()
	secondary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "secondary answered ", r.URL.Path)
	}))
	defer secondary.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Name:      "orders",
		Hedging:   resilience.HedgingOptions{Enabled: true, Delay: 50 * time.Millisecond},
		Endpoints: []resilience.Endpoint{{URL: primary.URL}, {URL: secondary.URL + "/v2"}},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	resp, err := (&http.Client{Transport: t}).Get("http://orders.internal/items/7")
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))
	// Output: secondary answered /v2/items/7
}

// An upstream that keeps the idempotency-key protocol stores each key's
// outcome, so a POST that carries a key can be retried: here the first
// attempt's answer is lost with its connection, and the retry, with the
// same key, gets the stored answer instead of charging twice.
func ExampleIdempotencyOptions() {
	var mu sync.Mutex
	charges := map[string]string{} // key -> the charge it made: the upstream's store
	var attempts atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		id, seen := charges[key]
		if !seen {
			id = fmt.Sprintf("ch_%d", len(charges)+1)
			charges[key] = id
		}
		mu.Unlock()
		if attempts.Add(1) == 1 { // the charge is made, but its answer is lost
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, id)
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(nil, resilience.Options{
		Name:        "payments",
		Retry:       resilience.RetryOptions{Delay: time.Millisecond},
		Idempotency: resilience.IdempotencyOptions{Enabled: true},
	})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()

	resp, err := (&http.Client{Transport: t}).Post(upstream.URL, "application/json", strings.NewReader(`{"amount": 100}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "attempts:", attempts.Load(), "charges:", len(charges))
	// Output: 201 ch_1 attempts: 2 charges: 1
}

// Options reads the options a handler runs with, every default filled in;
// changed and given to Update, they change one field and keep the rest.
func ExampleHandler_Options() {
	h, err := resilience.NewHandler(resilience.Options{Name: "orders", TotalTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	o := h.Options()
	fmt.Println(o.TotalTimeout, o.AttemptTimeout, o.Retry.MaxRetries, o.Retry.Delay, o.CircuitBreaker.FailureRatio)

	o.Retry.MaxRetries = 1
	if err := h.Update(o); err != nil {
		panic(err)
	}
	fmt.Println(h.Options().Retry.MaxRetries, h.Options().AttemptTimeout)
	// Output:
	// 5s 5s 3 2s 0.9
	// 1 5s
}

// A streamed body (server-sent events, a long download) should not be cut
// by the total timeout, only its time to the response headers bounded: a
// negative WithTotalTimeout turns the total timeout off for that call, and
// WithAttemptTimeout bounds each attempt until its headers arrive, not
// while its body is read.
func ExampleWithTotalTimeout() {
	stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK) // the headers at once
		for i := 0; i < 6; i++ {
			fmt.Fprintf(w, "event %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond) // the body over 600ms
		}
	}))
	defer stream.Close()
	t, err := resilience.NewTransport(nil, resilience.Options{Name: "events", TotalTimeout: 200 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}

	read := func(ctx context.Context) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, stream.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return bytes.Count(body, []byte("\n")), err
	}

	_, err = read(context.Background())
	fmt.Println("the handler's total timeout ends the stream:", errors.Is(err, resilience.ErrTotalTimeout))

	ctx := resilience.WithTotalTimeout(context.Background(), -1) // the body may take as long as it takes
	ctx = resilience.WithAttemptTimeout(ctx, 2*time.Second)      // but the headers must come within 2s
	events, err := read(ctx)
	fmt.Println(events, "events, error:", err)
	// Output:
	// the handler's total timeout ends the stream: true
	// 6 events, error: <nil>
}
