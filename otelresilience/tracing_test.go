package otelresilience_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/otelresilience"
)

// traced sends one GET through a traced handler against an upstream that
// answers 503, 503, 200, under a caller's span, and returns what the
// recorder saw and the caller's span.
func traced(t *testing.T, opts ...otelresilience.Option) (*tracetest.SpanRecorder, sdktrace.ReadOnlySpan, []trace.SpanContext) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := otelresilience.New(mp, append([]otelresilience.Option{otelresilience.WithTracerProvider(tp)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })

	var seen []trace.SpanContext // the span context of every event's Context
	h, err := resilience.NewHandler(m.Instrument(resilience.Options{
		Name:  "ledger",
		Retry: resilience.RetryOptions{Delay: time.Millisecond, NoJitter: true, Backoff: resilience.BackoffConstant, IgnoreRetryAfter: true},
		OnEvent: func(e resilience.Event) {
			seen = append(seen, trace.SpanContextFromContext(e.Context))
		},
	}))
	require.NoError(t, err)
	up := newUpstream(t, 503, 503, 200)
	tr := h.Transport(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)

	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	caller.End()

	for _, s := range sr.Ended() {
		if s.Name() == "caller" {
			return sr, s, seen
		}
	}
	require.FailNow(t, "no caller span")
	return nil, nil, nil
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// Each attempt is a span under the caller's, with its number, the wait
// before it and its outcome; the retries are events on the caller's span.
func TestTracingAttemptSpans(t *testing.T) {
	sr, caller, seen := traced(t)

	require.NotEmpty(t, seen)
	for _, sc := range seen {
		assert.Equal(t, caller.SpanContext().TraceID(), sc.TraceID(), "every event carries the caller's trace")
		assert.Equal(t, caller.SpanContext().SpanID(), sc.SpanID(), "and the caller's span")
	}

	var attempts []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "resilience.attempt" {
			attempts = append(attempts, s)
		}
	}
	require.Len(t, attempts, 3, "503, 503, 200")
	for i, s := range attempts {
		assert.Equal(t, caller.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
		a := attrMap(s.Attributes())
		assert.Equal(t, int64(i+1), a["resilience.attempt"])
		assert.Equal(t, "ledger", a["resilience.handler"])
		if i == 0 {
			assert.Equal(t, 0.0, a["resilience.delay"], "no wait before the first attempt")
		} else {
			assert.Equal(t, 0.001, a["resilience.delay"], "the backoff before attempt %d", i+1)
		}
		assert.False(t, s.EndTime().Before(s.StartTime()))
	}
	assert.Equal(t, "failure", attrMap(attempts[0].Attributes())["resilience.outcome"])
	assert.Equal(t, int64(503), attrMap(attempts[0].Attributes())["http.response.status_code"])
	assert.Equal(t, codes.Error, attempts[0].Status().Code)
	assert.Equal(t, "success", attrMap(attempts[2].Attributes())["resilience.outcome"])
	assert.Equal(t, codes.Unset, attempts[2].Status().Code)

	var names []string
	for _, ev := range caller.Events() {
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{"resilience.retry", "resilience.retry", "resilience.call"}, names)
	retry := attrMap(caller.Events()[0].Attributes)
	assert.Equal(t, "503", retry["resilience.reason"], "why it was retried")
	assert.Equal(t, int64(1), retry["resilience.attempt"])
	call := attrMap(caller.Events()[2].Attributes)
	assert.Equal(t, int64(3), call["resilience.attempt"], "the call made 3 attempts")
	assert.Equal(t, "success", call["resilience.outcome"])
}

// With WithAttemptSpans(false), for a base RoundTripper that already makes
// a span per attempt, attempts are events on the caller's span.
func TestTracingAttemptEvents(t *testing.T) {
	sr, caller, _ := traced(t, otelresilience.WithAttemptSpans(false))
	for _, s := range sr.Ended() {
		assert.NotEqual(t, "resilience.attempt", s.Name())
	}
	var names []string
	for _, ev := range caller.Events() {
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{"resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.call"}, names)
}

// A routed attempt's span names the endpoint it went to: with failover
// across two endpoints, the first attempt's span says the primary, the
// retry's the secondary.
func TestTracingAttemptSpanEndpoint(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := otelresilience.New(mp, otelresilience.WithTracerProvider(tp))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })

	primary, secondary := newUpstream(t, 503), newUpstream(t, 200)
	h, err := resilience.NewHandler(m.Instrument(resilience.Options{
		Name:    "ledger",
		PerHost: resilience.PerHostOptions{Enabled: true},
		Retry:   resilience.RetryOptions{Delay: time.Millisecond, NoJitter: true, IgnoreRetryAfter: true},
		Hedging: resilience.HedgingOptions{Endpoints: []resilience.Endpoint{{URL: primary.URL}, {URL: secondary.URL}}},
	}))
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	t.Cleanup(tr.CloseIdleConnections)

	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://ledger.invalid/", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	caller.End()

	var endpoints []any
	for _, s := range sr.Ended() {
		if s.Name() == "resilience.attempt" {
			endpoints = append(endpoints, attrMap(s.Attributes())["resilience.endpoint"])
		}
	}
	assert.Equal(t, []any{primary.URL, secondary.URL}, endpoints)
}
