package otelresilience_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/otelresilience"
)

// The cost OnEvent adds to an attempt: the attribute set comes from the
// cache, the measurement goes to the SDK's aggregation.
func BenchmarkOnEventAttempt(b *testing.B) {
	e := resilience.Event{Kind: resilience.EventAttempt, Handler: "pricing", Method: "GET", Attempt: 1, StatusCode: 200, Duration: 3 * time.Millisecond}
	b.Run("sdk", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(b.Context())
		m, err := otelresilience.New(mp)
		if err != nil {
			b.Fatal(err)
		}
		benchOnEvent(b, m, e)
	})
	b.Run("noop", func(b *testing.B) {
		m, err := otelresilience.New(noop.NewMeterProvider())
		if err != nil {
			b.Fatal(err)
		}
		benchOnEvent(b, m, e)
	})
	b.Run("sdk-perhost", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(b.Context())
		m, err := otelresilience.New(mp)
		if err != nil {
			b.Fatal(err)
		}
		e := e
		e.Host = "https://pricing.internal:8443"
		benchOnEvent(b, m, e)
	})
	b.Run("sdk-error", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(b.Context())
		m, err := otelresilience.New(mp)
		if err != nil {
			b.Fatal(err)
		}
		e := e
		e.StatusCode, e.Err = 0, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		benchOnEvent(b, m, e)
	})
}

func benchOnEvent(b *testing.B, m *otelresilience.Metrics, e resilience.Event) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.OnEvent(e)
		}
	})
}
