// Package otelresilience records the events of resilience handlers as
// OpenTelemetry metrics, on a MeterProvider the caller supplies, and, with
// WithTracerProvider, traces their calls: a client span per attempt sent,
// made by the RoundTripper AttemptTransport returns, and the handler's
// decisions as events on the caller's span (see Tracing below).
//
// Wire it in once per process and once per handler:
//
//	m, err := otelresilience.New(provider, otelresilience.WithTracerProvider(tp))
//	...
//	h, err := resilience.NewHandler(m.Instrument(opts))
//	...
//	err = m.Observe(h)
//	client := &http.Client{Transport: h.Transport(m.AttemptTransport(base))}
//
// The root package resilience does not depend on OpenTelemetry: only
// programs that import this package do.
//
// # Instruments
//
// All instruments are created on the Meter named ScopeName.
//
//   - resilience.events (Int64Counter, unit {event}): one per Event other
//     than EventAttempt and EventCall: retries, attempt and total timeouts,
//     the circuit opening, half-opening and closing, rejections by the
//     circuit and by admission control. Attributes: resilience.handler,
//     resilience.event (the kind's name, as resilience.EventKind.String
//     gives it: "retry", "circuit_opened", ...), and, when the event has
//     them, http.request.method, http.response.status_code, error.type and
//     the host attributes.
//   - resilience.server.refusals (Int64Counter, unit {request}): one per
//     request package server refused, through OnServerEvent. Attributes:
//     resilience.server.event (server.EventKind.String: "expired",
//     "retry_refused", "overloaded") and resilience.retry (whether the
//     request was a retry).
//   - resilience.attempt.duration (Float64Histogram, unit s): one per
//     attempt (EventAttempt), from sending it until its response headers
//     or its error. Attributes: resilience.handler, resilience.attempt (the
//     attempt's number, from 1), resilience.outcome, http.request.method,
//     and http.response.status_code or error.type, and the host attributes.
//   - resilience.call.duration (Float64Histogram, unit s): one per call
//     (EventCall), from RoundTrip until it returned to its caller
//     (admission, every attempt and the waits between them; not reading
//     the body). Attributes: resilience.handler, resilience.outcome,
//     http.request.method, http.response.status_code or error.type, and the
//     host attributes.
//   - resilience.circuit.state (Int64ObservableGauge, unit {state}): the
//     circuit state of every handler passed to Observe, as the value of
//     resilience.CircuitState: 0 closed, 1 half-open, 2 open, 3 isolated.
//     One point per handler with the attribute resilience.handler alone
//     (with PerHost, the least healthy host's state), and, for a handler
//     with PerHost, one more point per host it keeps, with the host
//     attributes too.
//   - resilience.overload.limit (Int64ObservableGauge, unit {attempt}):
//     for every handler passed to Observe whose Options.Overload is on,
//     the attempts in flight its overload limiter allows now: one point
//     with resilience.handler alone, or with PerHost one per host, with
//     the host attributes (none when WithHostAttributes is off).
//
// # Attributes
//
//   - resilience.handler: the handler's name.
//   - http.request.method: the request's method when it is one of the nine
//     of RFC 9110 and RFC 5789, "_OTHER" otherwise, as OpenTelemetry's HTTP
//     conventions say, so that a client cannot grow the series without end.
//   - http.response.status_code: the response status, when there is one.
//   - error.type: set when the event carries an error, from a short list:
//     "attempt_timeout" and "total_timeout" (the handler's own timeouts,
//     resilience.ErrAttemptTimeout and resilience.ErrTotalTimeout),
//     "circuit_open" (resilience.ErrCircuitOpen), "rate_limited"
//     (resilience.ErrRateLimited), "overloaded" (resilience.ErrOverloaded),
//     "budget_exhausted" (on budget_exceeded
//     events, resilience.ErrBudgetExhausted), "canceled" (context.Canceled: the caller
//     gave up), "deadline_exceeded" (the caller's own deadline), "timeout"
//     (any other error whose Timeout method reports true, such as a dial
//     timeout), and otherwise the Go type of the cause under the handler's
//     and net/http's wrappers, such as "*net.OpError" or
//     "*tls.CertificateVerificationError". The set is bounded by the error
//     types the program contains. On circuit_opened and circuit_rejected
//     events the error is the reason the circuit is open, a description of
//     the failures: error.type is "isolated" when Handler.IsolateCircuit
//     holds it open, and absent otherwise.
//   - resilience.endpoint: for an attempt routed by Options.Endpoints (on
//     resilience.attempt.duration, and on attempt_timeout and
//     circuit_rejected events), the base URL of the endpoint it went to,
//     as configured: as many values as the handler has endpoints. Refused
//     hedges are counted as hedge_capped events, once per call.
//   - resilience.outcome: how an attempt or a call ended, by the standard
//     classification resilience.IsTransient (a handler's own ShouldRetry or
//     ShouldHandle is not seen here): "success" for a response whose status
//     is not transient (a 404 is a success: the upstream answered),
//     "failure" for a transient status (408, 429, most 5xx) or an error,
//     "timeout" for an error of the "attempt_timeout", "total_timeout",
//     "deadline_exceeded" or "timeout" types, "canceled" when the caller
//     cancelled, and, for calls only, "rejected" when the circuit or
//     admission control refused the call without sending it.
//   - host attributes, for a handler with PerHost (the event's Host, the
//     authority scheme://host[:port]): server.address (the host name or
//     address), server.port (the port, the scheme's default when the
//     authority has none) and url.scheme. WithHostAttributes(false) leaves
//     them out for a handler that calls very many hosts.
//
// # Tracing
//
// With WithTracerProvider, every attempt a handler sends through
// AttemptTransport is a span of kind client, by OpenTelemetry's stable
// HTTP client conventions:
//
//   - It starts just before the attempt is sent, as a child of the span in
//     the request's context, and its context goes into the attempt's
//     headers with the propagators (WithPropagators; the global ones by
//     default), so that the upstream's server span is its child. It ends
//     when the attempt's response headers arrive, or when it fails: the
//     body is the caller's to read, as for resilience.attempt.duration.
//     Attempts that are sent concurrently, as hedges are, each have their
//     own span.
//   - Its name is the method ("GET"; "HTTP" for a method the conventions do
//     not know).
//   - Attributes: http.request.method (and http.request.method_original
//     when the method was written otherwise), server.address, server.port
//     (the scheme's default when the URL has none), url.full (without
//     userinfo, as otelhttp writes it, and with the values of the query
//     parameters the conventions name as secrets, such as sig and
//     X-Amz-Signature, replaced by REDACTED), http.response.status_code,
//     http.request.resend_count on every attempt after the first (its
//     number less one: retries and hedges alike; a redirect is a new call,
//     whose attempts count from 1 again), error.type, and the resilience
//     attributes: resilience.handler, resilience.attempt,
//     resilience.delay (the seconds waited before it), resilience.endpoint
//     (for an attempt routed by Options.Endpoints) and resilience.outcome.
//   - error.type and the span's status, as the conventions say: for a
//     response of status 400 and over, the status code ("503") and status
//     Error; for an attempt that failed without a response, the error's
//     class and status Error with its message. The classes:
//     "attempt_timeout" and "total_timeout" (the handler's deadlines cut
//     it), "canceled" (the caller left, or another hedged attempt won),
//     "deadline_exceeded" (the caller's deadline), an error's own
//     ErrorType method's answer, "timeout" (any other error whose Timeout
//     method reports true), and otherwise the cause's Go type as package
//     path and name, without the pointer's "*" and under net/http's and
//     fmt.Errorf's wrappers, such as "net.OpError"; "_OTHER" if there is
//     none. (The metrics' error.type keeps the Go type as Go prints it,
//     "*net.OpError", as it always has.)
//
// An attempt that is never sent (the circuit rejected it, the overload
// limiter shed it) has no span. What the handler decided around the
// attempts is an event on the caller's span: "resilience.retry" (with
// resilience.reason, the status or error type that was retried, and the
// wait), "resilience.budget_exceeded", "resilience.circuit_rejected",
// "resilience.overload_shed", "resilience.hedge", "resilience.hedge_capped",
// and "resilience.call" at the end (how many attempts, and the outcome). A
// call made without a span in its request's context is not traced, and
// nothing goes into its attempts' headers.
//
// With otelhttp:
//
//   - Outside, around the resilience transport, as
//     otelhttp.NewTransport(h.Transport(m.AttemptTransport(base))): its
//     client span covers the whole call, retries and waits included, and
//     each attempt's span is its child. The error a resilience Transport
//     returns names its class with an ErrorType method, which otelhttp
//     records as error.type on that span: "circuit_open", "rate_limited",
//     "overloaded", "total_timeout", "attempt_timeout", and for a cause the
//     names above. (otelhttp's http.client.request.duration metric names
//     the Go type of the error, without looking for the method.)
//   - Inside, as the base, as
//     h.Transport(otelhttp.NewTransport(m.AttemptTransport(base))): otelhttp
//     already makes a client span per attempt. With WithAttemptSpans(false)
//     AttemptTransport makes none, and adds http.request.resend_count and
//     the resilience attributes to otelhttp's span instead; the attempts
//     are also "resilience.attempt" events on the caller's span.
//
// A handler whose base AttemptTransport does not wrap has no attempt
// spans: its attempts are "resilience.attempt" events on the caller's span.
//
// # Cost
//
// OnEvent runs synchronously on the caller's goroutine. The attribute sets
// are built once per combination of attribute values and cached, so that
// recording an event that was seen before allocates nothing in this
// package; see BenchmarkOnEventAttempt.
package otelresilience

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
)

// ScopeName is the name of the Meter the instruments are created on: the
// package's import path.
const ScopeName = "github.com/resilienthttp/resilience/otelresilience"

// durationBuckets are the bucket boundaries, in seconds, of both duration
// histograms: OpenTelemetry's for HTTP client request durations.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Metrics records the events of resilience handlers on OpenTelemetry
// instruments and reports the circuit state of the handlers it observes.
// It is safe for concurrent use. Make one per MeterProvider and share it
// among handlers: each handler's events carry its name.
type Metrics struct {
	hosts         bool                          // record the host attributes
	tracer        trace.Tracer                  // nil without WithTracerProvider
	propagators   propagation.TextMapPropagator // put an attempt span into its headers
	attemptEvents bool                          // AttemptTransport makes no spans; attempts are span events

	spannedMu sync.Mutex
	spanned   atomic.Pointer[map[string]bool] // the handlers AttemptTransport has sent attempts of

	events   metric.Int64Counter
	attempts metric.Float64Histogram
	calls    metric.Float64Histogram
	state    metric.Int64ObservableGauge
	limit    metric.Int64ObservableGauge // the overload limiter's limit
	refusals metric.Int64Counter         // the server half's (OnServerEvent)

	eventSets   setCache
	attemptSets setCache
	callSets    setCache
	stateSets   setCache

	mu       sync.Mutex
	reg      metric.Registration // the gauge's callback; nil once closed
	observed []*resilience.Handler
}

// An Option configures New.
type Option interface{ apply(*config) }

type config struct {
	hosts         bool
	tp            trace.TracerProvider
	propagators   propagation.TextMapPropagator
	attemptEvents bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithHostAttributes says whether measurements about a PerHost handler's
// hosts carry the host attributes (server.address, server.port,
// url.scheme). Default true. Turn it off when a handler calls so many hosts
// that a series per host would be too many: the events are then counted
// per handler only, and the circuit state gauge reports the handler's
// overall state only.
func WithHostAttributes(enabled bool) Option {
	return optionFunc(func(c *config) { c.hosts = enabled })
}

// New creates the instruments on mp's Meter named ScopeName and returns the
// Metrics that records on them. There is no default: pass the provider the
// program set up (otel.GetMeterProvider() for the global one).
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("otelresilience: nil MeterProvider")
	}
	cfg := config{hosts: true}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{hosts: cfg.hosts, attemptEvents: cfg.attemptEvents, propagators: cfg.propagators}
	if cfg.tp != nil {
		m.tracer = cfg.tp.Tracer(ScopeName)
	}
	if m.propagators == nil {
		m.propagators = otel.GetTextMapPropagator()
	}
	var errs [6]error
	m.events, errs[0] = meter.Int64Counter("resilience.events",
		metric.WithUnit("{event}"),
		metric.WithDescription("Events of resilience handlers: retries, timeouts, circuit transitions and rejections."))
	m.attempts, errs[1] = meter.Float64Histogram("resilience.attempt.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of each attempt of a call, until its response headers or its error."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	m.calls, errs[2] = meter.Float64Histogram("resilience.call.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of each call through a resilience handler, retries and waits included, until it returned to its caller."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	m.state, errs[3] = meter.Int64ObservableGauge("resilience.circuit.state",
		metric.WithUnit("{state}"),
		metric.WithDescription("Circuit state of a resilience handler: 0 closed, 1 half-open, 2 open, 3 isolated."))
	m.limit, errs[4] = meter.Int64ObservableGauge("resilience.overload.limit",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts in flight the overload limiter of a resilience handler allows its upstream now."))
	m.refusals, errs[5] = meter.Int64Counter("resilience.server.refusals",
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests the server half of the deadline contract refused before any work: spent budgets, retries over their share, overload."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("otelresilience: creating instruments: %w", err)
	}
	reg, err := meter.RegisterCallback(m.observe, m.state, m.limit)
	if err != nil {
		return nil, fmt.Errorf("otelresilience: registering the circuit state callback: %w", err)
	}
	m.reg = reg
	return m, nil
}

// OnEvent records e. It is an Options.OnEvent; Instrument sets it there.
// Measurements are recorded with the request's context, so that an
// exemplar can point at the caller's trace.
func (m *Metrics) OnEvent(e resilience.Event) {
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	k := m.key(&e)
	switch e.Kind {
	case resilience.EventAttempt:
		k.attempt = e.Attempt
		m.attempts.Record(ctx, e.Duration.Seconds(), m.attemptSets.get(k, attemptSet).record...)
	case resilience.EventCall:
		m.calls.Record(ctx, e.Duration.Seconds(), m.callSets.get(k, callSet).record...)
	default:
		k.kind = e.Kind
		m.events.Add(ctx, 1, m.eventSets.get(k, eventSet).add...)
	}
	if m.tracer != nil {
		m.trace(&e, k)
	}
}

// key gathers the attribute values e shares with every instrument.
func (m *Metrics) key(e *resilience.Event) setKey {
	k := setKey{
		handler: e.Handler,
		method:  method(e.Method),
		status:  e.StatusCode,
		// As many values as the handler has endpoints: the configured
		// base, never the request's URL.
		endpoint: e.Endpoint,
	}
	if m.hosts {
		k.host = e.Host
	}
	if e.Err != nil {
		if e.Kind == resilience.EventCircuitOpened || e.Kind == resilience.EventCircuitRejected {
			k.errType = circuitReason(e.Err)
		} else {
			k.errType = errorType(e.Err)
		}
	}
	return k
}

// Instrument returns opts with m.OnEvent in Options.OnEvent. An OnEvent
// already there is kept: it is called after m.OnEvent with the same event.
func (m *Metrics) Instrument(opts resilience.Options) resilience.Options {
	if next := opts.OnEvent; next != nil {
		opts.OnEvent = func(e resilience.Event) {
			m.OnEvent(e)
			next(e)
		}
	} else {
		opts.OnEvent = m.OnEvent
	}
	return opts
}

// Observe adds handlers to those whose circuit state resilience.circuit.state
// reports. Observing a handler again does nothing. It is an error to observe
// a nil handler, two handlers of the same name (their points could not be
// told apart; Unobserve the old one first), or to observe after Close; then
// none of hs is added.
func (m *Metrics) Observe(hs ...*resilience.Handler) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reg == nil {
		return errors.New("otelresilience: Observe after Close")
	}
	add := make([]*resilience.Handler, 0, len(hs))
	names := make(map[string]*resilience.Handler, len(m.observed)+len(hs))
	for _, h := range m.observed {
		names[h.Name()] = h
	}
	for i, h := range hs {
		if h == nil {
			return fmt.Errorf("otelresilience: Observe: handler %d is nil", i)
		}
		switch other := names[h.Name()]; {
		case other == h:
			continue
		case other != nil:
			return fmt.Errorf("otelresilience: Observe: another handler named %q is already observed", h.Name())
		}
		names[h.Name()] = h
		add = append(add, h)
	}
	// Copy on write: a collection in progress keeps the slice it took.
	m.observed = append(m.observed[:len(m.observed):len(m.observed)], add...)
	return nil
}

// Unobserve removes handlers from those the gauge reports, as when a
// configuration reload replaces them. A handler not observed is ignored.
func (m *Metrics) Unobserve(hs ...*resilience.Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := make([]*resilience.Handler, 0, len(m.observed))
	for _, h := range m.observed {
		drop := false
		for _, x := range hs {
			drop = drop || x == h
		}
		if !drop {
			kept = append(kept, h)
		}
	}
	m.observed = kept
}

// Close unregisters the circuit state callback and forgets the observed
// handlers: the gauge reports nothing more. OnEvent keeps recording, so a
// handler built with Instrument may outlive Close. Close is idempotent.
func (m *Metrics) Close() error {
	m.mu.Lock()
	reg := m.reg
	m.reg, m.observed = nil, nil
	m.mu.Unlock()
	if reg == nil {
		return nil
	}
	if err := reg.Unregister(); err != nil {
		return fmt.Errorf("otelresilience: unregistering the circuit state callback: %w", err)
	}
	return nil
}

// observe is the gauge's callback.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	hs := m.observed
	m.mu.Unlock()
	for _, h := range hs {
		name := h.Name()
		o.ObserveInt64(m.state, int64(h.CircuitState()), m.stateSets.get(setKey{handler: name}, stateSet).observe...)
		if !m.hosts {
			continue
		}
		for host, s := range h.HostCircuitStates() {
			o.ObserveInt64(m.state, int64(s), m.stateSets.get(setKey{handler: name, host: host}, stateSet).observe...)
		}
	}
	for _, h := range hs {
		name := h.Name()
		for host, st := range h.OverloadStats() { // nil when the limiter is off
			if host != "" && !m.hosts {
				continue
			}
			o.ObserveInt64(m.limit, int64(st.Limit), m.stateSets.get(setKey{handler: name, host: host}, stateSet).observe...)
		}
	}
	return nil
}
