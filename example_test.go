package resilience_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
