package otelresilience_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/otelresilience"
)

// propagator is the one every side of a test uses: W3C trace context,
// without the global.
var propagator = propagation.TraceContext{}

// A tracing rig is a TracerProvider whose ended spans the test reads, and a
// Metrics tracing on it.
type tracing struct {
	tp    *sdktrace.TracerProvider
	sr    *tracetest.SpanRecorder
	ended chan struct{} // signalled after a span ended
	m     *otelresilience.Metrics
}

// endSignal signals a channel when a span ends, after the recorder has it.
type endSignal struct {
	sdktrace.SpanProcessor
	ch chan struct{}
}

func (e endSignal) OnEnd(sdktrace.ReadOnlySpan) {
	select {
	case e.ch <- struct{}{}:
	default: // a signal is pending already
	}
}

func newTracing(t *testing.T, opts ...otelresilience.Option) *tracing {
	t.Helper()
	r := &tracing{sr: tracetest.NewSpanRecorder(), ended: make(chan struct{}, 1)}
	r.tp = sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(r.sr),
		sdktrace.WithSpanProcessor(endSignal{tracetest.NewSpanRecorder(), r.ended}))
	t.Cleanup(func() { require.NoError(t, r.tp.Shutdown(context.Background())) })
	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	base := []otelresilience.Option{otelresilience.WithTracerProvider(r.tp), otelresilience.WithPropagators(propagator)}
	m, err := otelresilience.New(mp, append(base, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	r.m = m
	return r
}

// waitFor returns the ended spans once cond holds for them. It blocks until
// then: spans end on other goroutines (a server's, a hedge's), and there is
// no time after which they could be said not to.
func (r *tracing) waitFor(cond func([]sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	for {
		if spans := r.sr.Ended(); cond(spans) {
			return spans
		}
		<-r.ended
	}
}

// kinds returns a condition: at least n ended spans of kind k.
func atLeast(n int, k trace.SpanKind) func([]sdktrace.ReadOnlySpan) bool {
	return func(spans []sdktrace.ReadOnlySpan) bool { return len(ofKind(spans, k, "")) >= n }
}

// ofKind returns the spans of kind k, of the instrumentation scope named
// scope ("" for any), in the order they started.
func ofKind(spans []sdktrace.ReadOnlySpan, k trace.SpanKind, scope string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == k && (scope == "" || s.InstrumentationScope().Name == scope) {
			out = append(out, s)
		}
	}
	for i := 1; i < len(out); i++ { // by start time: a hedge's span ends before the loser's
		for j := i; j > 0 && out[j].StartTime().Before(out[j-1].StartTime()); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func named(spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, ev := range s.Events() {
		names = append(names, ev.Name)
	}
	return names
}

// A tracedUpstream is an httptest server under otelhttp.NewHandler, so that
// every request it serves is a server span, a child of the span whose
// context the request's headers carry. It answers with the statuses of
// script in turn, then with the last one; a status of 0 hangs until the
// client gives up.
type tracedUpstream struct {
	*httptest.Server
	hits    atomic.Int64
	mu      sync.Mutex
	parents []string // the traceparent header of each request
}

func newTracedUpstream(t *testing.T, tp trace.TracerProvider, script ...int) *tracedUpstream {
	t.Helper()
	return newGatedUpstream(t, tp, nil, script...)
}

// newGatedUpstream is newTracedUpstream whose handler first calls before,
// if set.
func newGatedUpstream(t *testing.T, tp trace.TracerProvider, before func(), script ...int) *tracedUpstream {
	t.Helper()
	u := &tracedUpstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if before != nil {
			before()
		}
		u.mu.Lock()
		u.parents = append(u.parents, r.Header.Get("Traceparent"))
		u.mu.Unlock()
		n := int(u.hits.Add(1))
		status := script[min(n, len(script))-1]
		if status == 0 {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(status)
		w.Write([]byte("ok"))
	})
	u.Server = httptest.NewServer(otelhttp.NewHandler(h, "upstream",
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator)))
	t.Cleanup(u.Close)
	return u
}

func (u *tracedUpstream) traceparents() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.parents...)
}

// retryOptions retry at once, whatever the upstream says of when.
var retryOptions = resilience.RetryOptions{Delay: time.Millisecond, NoJitter: true, Backoff: resilience.BackoffConstant, IgnoreRetryAfter: true}

// callUnder sends req through rt under a span named "caller", reads and
// closes the body, and ends the span.
func (r *tracing) callUnder(t *testing.T, rt http.RoundTripper, method, target string) (*http.Response, error) {
	t.Helper()
	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	defer caller.End()
	req, err := http.NewRequestWithContext(ctx, method, target, nil)
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Empty(t, req.Header.Get("Traceparent"), "the caller's request is not modified")
	return resp, nil
}

// hostPort returns the host and port of an httptest server's URL.
func hostPort(t *testing.T, raw string) (string, int64) {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return u.Hostname(), int64(port)
}

// Each attempt is a client span under the caller's, started before it was
// sent: the upstream's server span for that attempt is its child. It has
// the HTTP client conventions' attributes, the resend count from the second
// attempt on, and the resilience attributes; the retries are events on the
// caller's span.
func TestTracingAttemptSpans(t *testing.T) {
	r := newTracing(t)
	up := newTracedUpstream(t, r.tp, 503, 503, 200)
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: retryOptions}))
	require.NoError(t, err)
	tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(tr.CloseIdleConnections)

	withSecrets := "http://user:pw@" + up.Listener.Addr().String() + "/books?q=1&sig=s3cret"
	resp, err := r.callUnder(t, tr, http.MethodGet, withSecrets)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)

	spans := r.waitFor(atLeast(3, trace.SpanKindServer))
	caller := named(spans, "caller")
	require.NotNil(t, caller)
	attempts := ofKind(spans, trace.SpanKindClient, otelresilience.ScopeName)
	require.Len(t, attempts, 3, "503, 503, 200")
	host, port := hostPort(t, up.URL)
	for i, s := range attempts {
		assert.Equal(t, "GET", s.Name())
		assert.Equal(t, caller.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
		a := attrMap(s.Attributes())
		assert.Equal(t, "GET", a["http.request.method"])
		assert.Equal(t, host, a["server.address"])
		assert.Equal(t, port, a["server.port"])
		assert.Equal(t, "http://"+up.Listener.Addr().String()+"/books?q=1&sig=REDACTED", a["url.full"], "no userinfo, no signature")
		assert.Equal(t, "ledger", a["resilience.handler"])
		assert.Equal(t, int64(i+1), a["resilience.attempt"])
		if i == 0 {
			assert.NotContains(t, a, "http.request.resend_count", "the first attempt is no resend")
			assert.Equal(t, 0.0, a["resilience.delay"])
		} else {
			assert.Equal(t, int64(i), a["http.request.resend_count"])
			assert.Equal(t, 0.001, a["resilience.delay"], "the backoff before attempt %d", i+1)
		}
	}
	for _, s := range attempts[:2] {
		a := attrMap(s.Attributes())
		assert.Equal(t, int64(503), a["http.response.status_code"])
		assert.Equal(t, "503", a["error.type"])
		assert.Equal(t, "failure", a["resilience.outcome"])
		assert.Equal(t, codes.Error, s.Status().Code)
	}
	last := attrMap(attempts[2].Attributes())
	assert.Equal(t, int64(200), last["http.response.status_code"])
	assert.NotContains(t, last, "error.type")
	assert.Equal(t, "success", last["resilience.outcome"])
	assert.Equal(t, codes.Unset, attempts[2].Status().Code)

	// Each server span is the child of one attempt's span, each its own.
	servers := ofKind(spans, trace.SpanKindServer, "")
	parents := map[trace.SpanID]bool{}
	for _, s := range attempts {
		parents[s.SpanContext().SpanID()] = true
	}
	seen := map[trace.SpanID]bool{}
	for _, s := range servers {
		assert.Equal(t, caller.SpanContext().TraceID(), s.SpanContext().TraceID())
		assert.True(t, parents[s.Parent().SpanID()], "the server span's parent is an attempt's span")
		assert.False(t, seen[s.Parent().SpanID()], "one server span per attempt span")
		seen[s.Parent().SpanID()] = true
	}

	assert.Equal(t, []string{"resilience.retry", "resilience.retry", "resilience.call"}, eventNames(caller),
		"no attempt events: the spans say it")
	call := attrMap(caller.Events()[2].Attributes)
	assert.Equal(t, int64(3), call["resilience.attempt"])
	assert.Equal(t, "success", call["resilience.outcome"])
}

// Hedged attempts, in flight together, each have their own span and their
// own server span under it; the loser's says it was cancelled.
func TestTracingHedgedAttemptSpans(t *testing.T) {
	r := newTracing(t)
	up := newTracedUpstream(t, r.tp, 0, 200) // the first hangs until cancelled
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{
		Name:    "quotes",
		Hedging: resilience.HedgingOptions{Enabled: true, MaxHedges: 1, Delay: time.Millisecond, MaxExtraLoad: resilience.NoExtraLoadCap},
	}))
	require.NoError(t, err)
	tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(tr.CloseIdleConnections)

	resp, err := r.callUnder(t, tr, http.MethodGet, up.URL)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)

	// The loser ends after the call, once it is cancelled.
	spans := r.waitFor(func(spans []sdktrace.ReadOnlySpan) bool {
		return len(ofKind(spans, trace.SpanKindServer, "")) == 2 && len(ofKind(spans, trace.SpanKindClient, "")) == 2
	})
	caller := named(spans, "caller")
	attempts := ofKind(spans, trace.SpanKindClient, otelresilience.ScopeName)
	require.Len(t, attempts, 2)
	byAttempt := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range attempts {
		assert.Equal(t, caller.SpanContext().SpanID(), s.Parent().SpanID())
		byAttempt[attrMap(s.Attributes())["resilience.attempt"].(int64)] = s
	}
	require.Len(t, byAttempt, 2)
	first, hedge := attrMap(byAttempt[1].Attributes()), attrMap(byAttempt[2].Attributes())
	assert.NotContains(t, first, "http.request.resend_count")
	assert.Equal(t, int64(1), hedge["http.request.resend_count"])
	assert.Equal(t, 0.001, hedge["resilience.delay"], "sent Delay after the first")
	// The one that reached the upstream first hangs: usually the first.
	winner, loser := byAttempt[2], byAttempt[1]
	if _, ok := first["http.response.status_code"]; ok {
		winner, loser = loser, winner
	}
	assert.Equal(t, int64(200), attrMap(winner.Attributes())["http.response.status_code"])
	assert.Equal(t, "canceled", attrMap(loser.Attributes())["error.type"], "the loser, cancelled")
	assert.Equal(t, codes.Error, loser.Status().Code)

	servers := ofKind(spans, trace.SpanKindServer, "")
	assert.ElementsMatch(t,
		[]trace.SpanID{byAttempt[1].SpanContext().SpanID(), byAttempt[2].SpanContext().SpanID()},
		[]trace.SpanID{servers[0].Parent().SpanID(), servers[1].Parent().SpanID()})
	assert.Contains(t, eventNames(caller), "resilience.hedge")
}

// An attempt that is never sent has no span: a call the circuit rejects,
// and a hedge the overload limiter sheds, are events on the caller's span.
func TestTracingUnsentAttemptsHaveNoSpan(t *testing.T) {
	t.Run("circuit", func(t *testing.T) {
		r := newTracing(t)
		up := newTracedUpstream(t, r.tp, 200)
		h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger"}))
		require.NoError(t, err)
		tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
		t.Cleanup(tr.CloseIdleConnections)

		h.IsolateCircuit()
		_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
		require.ErrorIs(t, err, resilience.ErrCircuitOpen)
		spans := r.sr.Ended()
		assert.Empty(t, ofKind(spans, trace.SpanKindClient, ""))
		assert.Equal(t, []string{"resilience.circuit_rejected", "resilience.call"}, eventNames(named(spans, "caller")))
		assert.Zero(t, up.hits.Load())
	})
	t.Run("shed", func(t *testing.T) {
		r := newTracing(t)
		gate, arrived := make(chan struct{}), make(chan struct{}, 1)
		up := newGatedUpstream(t, r.tp, func() {
			arrived <- struct{}{}
			<-gate // the first call holds the only slot until the second was shed
		}, 200)
		h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{
			Name:     "ledger",
			Overload: resilience.OverloadOptions{MinLimit: 1, InitialLimit: 1, MaxLimit: 1, MaxQueueWait: time.Millisecond},
		}))
		require.NoError(t, err)
		tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
		t.Cleanup(tr.CloseIdleConnections)

		done := make(chan error)
		go func() {
			req, err := http.NewRequest(http.MethodGet, up.URL, nil) // untraced
			if err == nil {
				var resp *http.Response
				if resp, err = tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
			done <- err
		}()
		<-arrived
		_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
		close(gate)
		require.ErrorIs(t, err, resilience.ErrOverloaded)
		require.NoError(t, <-done)

		spans := r.sr.Ended()
		assert.Empty(t, ofKind(spans, trace.SpanKindClient, ""), "the shed attempt was not sent")
		caller := named(spans, "caller")
		assert.Equal(t, []string{"resilience.overload_shed", "resilience.call"}, eventNames(caller))
		shed := attrMap(caller.Events()[0].Attributes)
		assert.Equal(t, int64(1), shed["resilience.attempt"])
		assert.Equal(t, "overloaded", shed["error.type"])
	})
}

// An attempt cut by the attempt timeout says so, whatever the base made of
// the cancellation.
func TestTracingAttemptTimeoutSpan(t *testing.T) {
	r := newTracing(t)
	up := newTracedUpstream(t, r.tp, 0) // hangs
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{
		Name:                 "ledger",
		AttemptTimeout:       50 * time.Millisecond,
		StrictAttemptTimeout: true, // one call alone: nothing overtakes it
		Retry:                resilience.RetryOptions{Disabled: true},
	}))
	require.NoError(t, err)
	tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(tr.CloseIdleConnections)

	_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
	require.ErrorIs(t, err, resilience.ErrAttemptTimeout)
	attempts := ofKind(r.sr.Ended(), trace.SpanKindClient, "")
	require.Len(t, attempts, 1)
	assert.Equal(t, "attempt_timeout", attrMap(attempts[0].Attributes())["error.type"])
	assert.Equal(t, "timeout", attrMap(attempts[0].Attributes())["resilience.outcome"])
	assert.Equal(t, codes.Error, attempts[0].Status().Code)
}

// A routed attempt's span names the endpoint it went to, and the server it
// was sent to: with failover across two endpoints, the first attempt's span
// says the primary, the retry's the secondary.
func TestTracingAttemptSpanEndpoint(t *testing.T) {
	r := newTracing(t)
	primary, secondary := newTracedUpstream(t, r.tp, 503), newTracedUpstream(t, r.tp, 200)
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{
		Name:      "ledger",
		PerHost:   resilience.PerHostOptions{Enabled: true},
		Retry:     retryOptions,
		Endpoints: []resilience.Endpoint{{URL: primary.URL}, {URL: secondary.URL}},
	}))
	require.NoError(t, err)
	tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(tr.CloseIdleConnections)

	_, err = r.callUnder(t, tr, http.MethodGet, "http://ledger.invalid/entries")
	require.NoError(t, err)

	attempts := ofKind(r.waitFor(atLeast(2, trace.SpanKindServer)), trace.SpanKindClient, "")
	require.Len(t, attempts, 2)
	for i, up := range []*tracedUpstream{primary, secondary} {
		a := attrMap(attempts[i].Attributes())
		host, port := hostPort(t, up.URL)
		assert.Equal(t, up.URL, a["resilience.endpoint"])
		assert.Equal(t, host, a["server.address"])
		assert.Equal(t, port, a["server.port"])
		assert.Equal(t, up.URL+"/entries", a["url.full"], "the URL the attempt was sent to")
	}
}

// Without a span in the request's context nothing is traced: no span, and
// no trace context in the attempts' headers.
func TestTracingNoCallerSpan(t *testing.T) {
	r := newTracing(t)
	up := newTracedUpstream(t, r.tp, 503, 200)
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: retryOptions}))
	require.NoError(t, err)
	tr := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(tr.CloseIdleConnections)

	req, err := http.NewRequest(http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"", ""}, up.traceparents())
	assert.Empty(t, ofKind(r.sr.Ended(), trace.SpanKindClient, ""))
}

// A handler whose base AttemptTransport does not wrap has no attempt
// spans: its attempts are events on the caller's span. So are they with
// WithAttemptSpans(false), which makes no span, and, with nothing else in
// the base to make one, adds nothing to the caller's span.
func TestTracingAttemptEvents(t *testing.T) {
	for name, tc := range map[string]struct {
		opts []otelresilience.Option
		wrap bool
	}{
		"unwrapped":      {},
		"spans disabled": {opts: []otelresilience.Option{otelresilience.WithAttemptSpans(false)}, wrap: true},
	} {
		t.Run(name, func(t *testing.T) {
			r := newTracing(t, tc.opts...)
			up := newTracedUpstream(t, r.tp, 503, 503, 200)
			h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: retryOptions}))
			require.NoError(t, err)
			var base http.RoundTripper = &http.Transport{}
			if tc.wrap {
				base = r.m.AttemptTransport(base)
			}
			tr := h.Transport(base)
			t.Cleanup(tr.CloseIdleConnections)

			_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
			require.NoError(t, err)
			spans := r.sr.Ended()
			assert.Empty(t, ofKind(spans, trace.SpanKindClient, ""))
			caller := named(spans, "caller")
			assert.Equal(t, []string{"resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.call"},
				eventNames(caller))
			assert.NotContains(t, attrMap(caller.Attributes()), "resilience.attempt")
			second := attrMap(caller.Events()[2].Attributes)
			assert.Equal(t, int64(2), second["resilience.attempt"])
			assert.Equal(t, int64(503), second["http.response.status_code"])
			assert.Equal(t, []string{"", "", ""}, up.traceparents(), "no span made, none propagated")
		})
	}
}

// otelhttp outside, around the resilience transport: its client span
// covers the call, each attempt's span is its child, and the server spans
// are the attempts' children.
func TestTracingOtelhttpOutside(t *testing.T) {
	r := newTracing(t)
	up := newTracedUpstream(t, r.tp, 503, 503, 200)
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: retryOptions}))
	require.NoError(t, err)
	inner := h.Transport(r.m.AttemptTransport(&http.Transport{}))
	t.Cleanup(inner.CloseIdleConnections)
	tr := otelhttp.NewTransport(inner, otelhttp.WithTracerProvider(r.tp), otelhttp.WithPropagators(propagator))

	_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
	require.NoError(t, err)

	spans := r.waitFor(atLeast(3, trace.SpanKindServer))
	outer := ofKind(spans, trace.SpanKindClient, otelhttpScope)
	require.Len(t, outer, 1, "otelhttp's span covers the call")
	assert.Equal(t, named(spans, "caller").SpanContext().SpanID(), outer[0].Parent().SpanID())
	assert.Equal(t, int64(200), attrMap(outer[0].Attributes())["http.response.status_code"])
	attempts := ofKind(spans, trace.SpanKindClient, otelresilience.ScopeName)
	require.Len(t, attempts, 3)
	ids := map[trace.SpanID]bool{}
	for _, s := range attempts {
		assert.Equal(t, outer[0].SpanContext().SpanID(), s.Parent().SpanID(), "each attempt under otelhttp's span")
		ids[s.SpanContext().SpanID()] = true
	}
	for _, s := range ofKind(spans, trace.SpanKindServer, "") {
		assert.True(t, ids[s.Parent().SpanID()], "the server span's parent is an attempt's span, not otelhttp's")
	}
}

// otelhttpScope is the instrumentation scope of otelhttp's spans.
const otelhttpScope = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

// otelhttp's span around a failed call records the handler's error.type
// (the error's ErrorType method), not *resilience.callError; the attempt's
// span records the same for an attempt that failed the same way.
func TestTracingOtelhttpOutsideErrorType(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	refused := closed.URL
	closed.Close()

	for _, tc := range []struct {
		name, url, want string
		isolate         bool
		attemptType     string // error.type of the attempt's span; "" for no attempt
	}{
		{name: "circuit", want: "circuit_open", isolate: true},
		{name: "refused", url: refused, want: "net.OpError", attemptType: "net.OpError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTracing(t)
			up := newTracedUpstream(t, r.tp, 200)
			if tc.url == "" {
				tc.url = up.URL
			}
			h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: resilience.RetryOptions{Disabled: true}}))
			require.NoError(t, err)
			inner := h.Transport(r.m.AttemptTransport(&http.Transport{}))
			t.Cleanup(inner.CloseIdleConnections)
			tr := otelhttp.NewTransport(inner, otelhttp.WithTracerProvider(r.tp), otelhttp.WithPropagators(propagator))
			if tc.isolate {
				h.IsolateCircuit()
			}

			_, err = r.callUnder(t, tr, http.MethodGet, tc.url)
			require.Error(t, err)
			spans := r.sr.Ended()
			outer := ofKind(spans, trace.SpanKindClient, otelhttpScope)
			require.Len(t, outer, 1)
			assert.Equal(t, tc.want, attrMap(outer[0].Attributes())["error.type"])
			assert.Equal(t, codes.Error, outer[0].Status().Code)
			attempts := ofKind(spans, trace.SpanKindClient, otelresilience.ScopeName)
			if tc.attemptType == "" {
				assert.Empty(t, attempts)
				return
			}
			require.Len(t, attempts, 1)
			assert.Equal(t, tc.attemptType, attrMap(attempts[0].Attributes())["error.type"])
		})
	}
}

// otelhttp inside, as the base, with WithAttemptSpans(false): otelhttp's
// client span per attempt is the only one, the server spans are its
// children, and AttemptTransport, under it, adds the resend count and the
// resilience attributes to it.
func TestTracingOtelhttpInside(t *testing.T) {
	r := newTracing(t, otelresilience.WithAttemptSpans(false))
	up := newTracedUpstream(t, r.tp, 503, 503, 200)
	h, err := resilience.NewHandler(r.m.Instrument(resilience.Options{Name: "ledger", Retry: retryOptions}))
	require.NoError(t, err)
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	base := otelhttp.NewTransport(r.m.AttemptTransport(transport), otelhttp.WithTracerProvider(r.tp), otelhttp.WithPropagators(propagator))
	tr := h.Transport(base)

	_, err = r.callUnder(t, tr, http.MethodGet, up.URL)
	require.NoError(t, err)

	spans := r.waitFor(func(spans []sdktrace.ReadOnlySpan) bool {
		return len(ofKind(spans, trace.SpanKindServer, "")) == 3 && len(ofKind(spans, trace.SpanKindClient, "")) == 3
	})
	clients := ofKind(spans, trace.SpanKindClient, "")
	require.Len(t, clients, 3, "one client span per attempt, otelhttp's")
	caller := named(spans, "caller")
	ids := map[trace.SpanID]bool{}
	for i, s := range clients {
		assert.Equal(t, otelhttpScope, s.InstrumentationScope().Name)
		assert.Equal(t, caller.SpanContext().SpanID(), s.Parent().SpanID())
		ids[s.SpanContext().SpanID()] = true
		a := attrMap(s.Attributes())
		assert.Equal(t, int64(i+1), a["resilience.attempt"])
		assert.Equal(t, "ledger", a["resilience.handler"])
		if i == 0 {
			assert.NotContains(t, a, "http.request.resend_count")
		} else {
			assert.Equal(t, int64(i), a["http.request.resend_count"])
		}
	}
	for _, s := range ofKind(spans, trace.SpanKindServer, "") {
		assert.True(t, ids[s.Parent().SpanID()], "the server span's parent is otelhttp's attempt span")
	}
	assert.Equal(t, []string{"resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.retry", "resilience.attempt", "resilience.call"},
		eventNames(caller))
	assert.NotContains(t, attrMap(caller.Attributes()), "resilience.attempt", "the caller's span is not an attempt's")
}
