package otelresilience_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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
