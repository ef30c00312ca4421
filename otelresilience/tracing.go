package otelresilience

import (
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
)

// Tracing. With WithTracerProvider, every attempt of a call is a span named
// "resilience.attempt", a child of the span in the request's context, from
// when the attempt was sent until its response headers or its error, with
// the attempt's number, the wait before it, its outcome and its status or
// error type. What the handler decided after it is an event on the caller's
// span: "resilience.retry" (and why: the status or error type that was
// retried, and the wait), "resilience.budget_exceeded" (a retry the budget
// refused, and why), "resilience.circuit_rejected", "resilience.hedge", and
// "resilience.call" at the end (how many attempts, and the outcome).
//
// Spans, not span events, for attempts: the usual set-up wraps the
// resilience transport in otelhttp.NewTransport, whose one client span
// covers the whole call, and an attempt is then a unit of work under it
// with a duration of its own, as each attempt is in .NET's instrumentation.
// When otelhttp (or anything else making client spans) sits inside instead,
// as the base RoundTripper, every attempt already has its span: turn ours
// into events on the caller's span with WithAttemptSpans(false).

// Attribute keys of tracing.
const (
	keyDelay  = attribute.Key("resilience.delay")  // seconds waited before an attempt, or before the next one
	keyReason = attribute.Key("resilience.reason") // why a retry was made or refused: a status code or an error type
)

// WithTracerProvider records each attempt as a span, and the handler's
// decisions as events on the caller's span, with tp's Tracer named
// ScopeName. The caller's span is the one in the request's context (see
// resilience.Event.Context): a call made without one is not traced. Default:
// no tracing.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithAttemptSpans says whether attempts are spans (true, the default) or
// events on the caller's span (false), for a set-up whose base RoundTripper
// already makes a span per attempt. It matters only with
// WithTracerProvider.
func WithAttemptSpans(enabled bool) Option {
	return optionFunc(func(c *config) { c.attemptEvents = !enabled })
}

// trace records e on the caller's trace, if the request has one.
func (m *Metrics) trace(e *resilience.Event, k setKey) {
	if e.Context == nil {
		return
	}
	parent := trace.SpanFromContext(e.Context)
	if !parent.SpanContext().IsValid() {
		return
	}
	base := [...]attribute.KeyValue{keyHandler.String(e.Handler), keyAttempt.Int(e.Attempt)}
	switch e.Kind {
	case resilience.EventAttempt:
		out := outcome(k, false)
		kv := append(base[:], keyDelay.Float64(e.Delay.Seconds()), keyOutcome.String(out))
		kv = appendResult(kv, k)
		if m.attemptEvents {
			parent.AddEvent("resilience.attempt", trace.WithAttributes(kv...))
			return
		}
		end := time.Now()
		_, span := m.tracer.Start(e.Context, "resilience.attempt",
			trace.WithTimestamp(end.Add(-e.Duration)), trace.WithAttributes(kv...))
		if out != outcomeSuccess {
			span.SetStatus(codes.Error, reason(k))
		}
		span.End(trace.WithTimestamp(end))
	case resilience.EventRetry:
		parent.AddEvent("resilience.retry", trace.WithAttributes(append(base[:],
			keyDelay.Float64(e.Delay.Seconds()), keyReason.String(reason(k)))...))
	case resilience.EventBudgetExceeded:
		kv := append(base[:], keyReason.String(errBudgetExhausted))
		parent.AddEvent("resilience.budget_exceeded", trace.WithAttributes(appendResult(kv, k)...))
	case resilience.EventCircuitRejected:
		parent.AddEvent("resilience.circuit_rejected", trace.WithAttributes(base[:]...))
	case resilience.EventHedge:
		parent.AddEvent("resilience.hedge", trace.WithAttributes(append(base[:],
			keyDelay.Float64(e.Delay.Seconds()))...))
	case resilience.EventHedgeCapped:
		parent.AddEvent("resilience.hedge_capped", trace.WithAttributes(base[:]...))
	case resilience.EventCall:
		kv := append(base[:], keyOutcome.String(outcome(k, true)))
		parent.AddEvent("resilience.call", trace.WithAttributes(appendResult(kv, k)...))
	}
}

// appendResult adds the status code or the error type of k, and the
// endpoint of a routed attempt.
func appendResult(kv []attribute.KeyValue, k setKey) []attribute.KeyValue {
	if k.endpoint != "" {
		kv = append(kv, keyEndpoint.String(k.endpoint))
	}
	if k.status != 0 {
		kv = append(kv, keyStatus.Int(k.status))
	}
	if k.errType != "" {
		kv = append(kv, keyErrType.String(k.errType))
	}
	return kv
}

// reason says why an attempt failed: its error type, or its status code.
func reason(k setKey) string {
	if k.errType != "" {
		return k.errType
	}
	if k.status != 0 {
		return strconv.Itoa(k.status)
	}
	return ""
}
