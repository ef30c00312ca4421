package otelresilience_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/otelresilience"
)

// Wire a handler's events and circuit state into a MeterProvider. A
// program would use its own provider with an exporter; here a manual reader
// reads the retries back.
func Example() {
	// An upstream that is busy twice, then answers.
	var hits atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())

	metrics, err := otelresilience.New(provider)
	if err != nil {
		panic(err)
	}
	defer metrics.Close()

	pricing, err := resilience.NewHandler(metrics.Instrument(resilience.Options{
		Name:  "pricing",
		Retry: resilience.RetryOptions{Delay: 10 * time.Millisecond},
	}))
	if err != nil {
		panic(err)
	}
	if err := metrics.Observe(pricing); err != nil {
		panic(err)
	}
	client := &http.Client{Transport: pricing.Transport(nil)}
	defer client.CloseIdleConnections()

	resp, err := client.Get(upstream.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]: // resilience.events
			for _, p := range data.DataPoints {
				event, _ := p.Attributes.Value("resilience.event")
				fmt.Println(m.Name, event.AsString(), p.Value)
			}
		case metricdata.Histogram[float64]:
			var n uint64
			for _, p := range data.DataPoints {
				n += p.Count
			}
			fmt.Println(m.Name, "count", n)
		case metricdata.Gauge[int64]: // resilience.circuit.state, resilience.overload.limit
			for _, p := range data.DataPoints {
				if m.Name == "resilience.circuit.state" {
					fmt.Println(m.Name, resilience.CircuitState(p.Value))
				} else {
					fmt.Println(m.Name, p.Value)
				}
			}
		}
	}
	// Output:
	// status 200
	// resilience.events retry 2
	// resilience.attempt.duration count 3
	// resilience.call.duration count 1
	// resilience.circuit.state closed
	// resilience.overload.limit 20
}

// Trace a call's attempts: each is a client span, started before the
// attempt is sent, whose context the upstream gets in its traceparent
// header, so that its server span is the attempt's child. A program would
// use its own TracerProvider with an exporter, and wrap the upstream in
// otelhttp.NewHandler; here a recorder reads the spans back and the
// upstream keeps the headers it got.
func ExampleMetrics_AttemptTransport() {
	var mu sync.Mutex
	var traceparents []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparents = append(traceparents, r.Header.Get("Traceparent"))
		first := len(traceparents) == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()

	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer tp.Shutdown(context.Background())

	m, err := otelresilience.New(noop.NewMeterProvider(),
		otelresilience.WithTracerProvider(tp),
		otelresilience.WithPropagators(propagation.TraceContext{}))
	if err != nil {
		panic(err)
	}
	pricing, err := resilience.NewHandler(m.Instrument(resilience.Options{Name: "pricing"}))
	if err != nil {
		panic(err)
	}
	// AttemptTransport wraps the base, the RoundTripper each attempt goes
	// through; nil is http.DefaultTransport.
	client := &http.Client{Transport: pricing.Transport(m.AttemptTransport(&http.Transport{}))}
	defer client.CloseIdleConnections()

	ctx, checkout := tp.Tracer("example").Start(context.Background(), "checkout")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/prices", nil)
	if err != nil {
		panic(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	checkout.End()

	n := 0
	for _, s := range recorder.Ended() {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		var status, resends int64
		var errType string
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "http.response.status_code":
				status = kv.Value.AsInt64()
			case "http.request.resend_count":
				resends = kv.Value.AsInt64()
			case "error.type":
				errType = kv.Value.AsString()
			}
		}
		fmt.Printf("%s %d resend_count=%d error.type=%q child of checkout: %v, propagated: %v\n",
			s.Name(), status, resends, errType,
			s.Parent().SpanID() == checkout.SpanContext().SpanID(),
			strings.Contains(traceparents[n], s.SpanContext().SpanID().String()))
		n++
	}
	// Output:
	// GET 503 resend_count=0 error.type="503" child of checkout: true, propagated: true
	// GET 200 resend_count=1 error.type="" child of checkout: true, propagated: true
}
