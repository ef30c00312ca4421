package otelresilience

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/resilienthttp/resilience/server"
)

// OnServerEvent records e, a refusal of the server half of the deadline
// contract, on resilience.server.refusals. It is a server.Options.OnEvent.
func (m *Metrics) OnServerEvent(e server.Event) {
	m.refusals.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("resilience.server.event", e.Kind.String()),
		attribute.Bool("resilience.retry", e.Attempt > 1)))
}
