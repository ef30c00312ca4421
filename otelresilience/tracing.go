package otelresilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilienthttp/resilience"
)

// Tracing: the package doc says what is recorded. A client span per
// attempt, rather than per call: the usual set-up wraps the resilience
// transport in otelhttp.NewTransport, whose one client span then covers the
// whole call, retries and waits included, while each attempt is a request
// of its own on the wire, with a server span of its own that must have a
// parent on the client's side. Only a RoundTripper under the handler sees
// an attempt before it is sent, and resilience.AttemptFromContext tells it
// which attempt it is.

// Attribute keys of tracing.
const (
	keyDelay          = attribute.Key("resilience.delay")  // seconds waited before an attempt, or before the next one
	keyReason         = attribute.Key("resilience.reason") // why a retry was made or refused: a status code or an error type
	keyURLFull        = attribute.Key("url.full")
	keyResendCount    = attribute.Key("http.request.resend_count")
	keyMethodOriginal = attribute.Key("http.request.method_original")
)

// errOther is error.type for an error the conventions' rules give no name.
const errOther = "_OTHER"

// WithTracerProvider traces each call's attempts, with tp's Tracer named
// ScopeName: a client span per attempt sent through AttemptTransport, and
// the handler's decisions as events on the caller's span. The caller's span
// is the one in the request's context (see resilience.Event.Context): a call
// made without one is not traced. Default: no tracing.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagators sets the propagators that put an attempt span's context
// into the attempt's request headers. Default: the global TextMapPropagator
// (otel.GetTextMapPropagator), as otelhttp's default is.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.propagators = p })
}

// WithAttemptSpans says whether AttemptTransport makes a client span per
// attempt (true, the default). Turn it off when the RoundTripper it wraps
// already makes one, as otelhttp.NewTransport does: AttemptTransport then
// adds http.request.resend_count and the resilience attributes to that
// span, and attempts are also events on the caller's span. It matters only
// with WithTracerProvider.
func WithAttemptSpans(enabled bool) Option {
	return optionFunc(func(c *config) { c.attemptEvents = !enabled })
}

// AttemptTransport returns a RoundTripper that sends each attempt of a
// handler's calls through base (nil means http.DefaultTransport) under a
// client span of its own. Give it to the handler as its base, innermost,
// under any otelhttp.NewTransport:
//
//	client := &http.Client{Transport: h.Transport(m.AttemptTransport(nil))}
//
// Without WithTracerProvider it returns base as it is. The handler must be
// built from options m.Instrument gave: a handler without observers does not
// describe its attempts (resilience.AttemptFromContext), and a request that
// is not a described attempt passes through untraced. The caller's request is never modified: an
// attempt's headers are copied before the trace context is put in them.
//
// A handler whose base is not wrapped has no attempt spans: its attempts
// are events on the caller's span, as with WithAttemptSpans(false).
func (m *Metrics) AttemptTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if m.tracer == nil {
		return base
	}
	return &attemptTransport{m: m, base: base}
}

// attemptTransport is what AttemptTransport returns.
type attemptTransport struct {
	m    *Metrics
	base http.RoundTripper
}

// RoundTrip sends r, the request of one attempt, under its client span.
func (t *attemptTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	m := t.m
	a, ok := resilience.AttemptFromContext(r.Context())
	if !ok {
		return t.base.RoundTrip(r)
	}
	current := trace.SpanFromContext(r.Context())
	if !current.SpanContext().IsValid() {
		return t.base.RoundTrip(r) // a call made without a span is not traced
	}
	if m.attemptEvents {
		// The base makes the client span. One made between the handler and
		// here, as otelhttp inside makes, gets the attempt's attributes.
		if !current.SpanContext().Equal(trace.SpanContextFromContext(a.Context)) {
			current.SetAttributes(attemptAttrs(nil, &a)...)
		}
		return t.base.RoundTrip(r)
	}
	m.sendsAttempts(a.Handler)

	meth, original := semconvMethod(r.Method)
	kv := make([]attribute.KeyValue, 0, 12)
	kv = append(kv, keyMethod.String(meth))
	if original != "" {
		kv = append(kv, keyMethodOriginal.String(original))
	}
	if r.URL != nil {
		kv = appendURL(kv, r.URL)
	}
	kv = attemptAttrs(kv, &a)
	name := meth
	if meth == methodOther {
		name = "HTTP"
	}
	ctx, span := m.tracer.Start(r.Context(), name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(kv...))

	r = r.WithContext(ctx) // a copy: the caller's request keeps its headers
	if r.Header = r.Header.Clone(); r.Header == nil {
		r.Header = make(http.Header)
	}
	m.propagators.Inject(ctx, propagation.HeaderCarrier(r.Header))

	resp, err := t.base.RoundTrip(r)
	endAttempt(ctx, span, resp, err)
	return resp, err
}

// CloseIdleConnections closes the idle connections of the base, if it has
// such a method, for resilience.Transport.CloseIdleConnections.
func (t *attemptTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// attemptAttrs appends the resilience attributes of attempt a, and the
// resend count of an attempt after the first.
func attemptAttrs(kv []attribute.KeyValue, a *resilience.Event) []attribute.KeyValue {
	kv = append(kv, keyHandler.String(a.Handler), keyAttempt.Int(a.Attempt), keyDelay.Float64(a.Delay.Seconds()))
	if a.Endpoint != "" {
		kv = append(kv, keyEndpoint.String(a.Endpoint))
	}
	if a.Attempt > 1 {
		kv = append(kv, keyResendCount.Int(a.Attempt-1))
	}
	return kv
}

// endAttempt ends the span of an attempt sent on ctx that came to resp and
// err: the status code, or error.type and the Error status as the HTTP
// client conventions say (the status code for one of 400 and over, or one
// that is not a status).
func endAttempt(ctx context.Context, span trace.Span, resp *http.Response, err error) {
	defer span.End()
	if err == nil && resp == nil { // a base breaking the RoundTripper contract
		span.SetAttributes(keyErrType.String(errOther))
		span.SetStatus(codes.Error, "nil response and nil error")
		return
	}
	if err != nil {
		et := ""
		if ctx.Err() != nil {
			switch cause := context.Cause(ctx); {
			case cause == resilience.ErrAttemptTimeout || cause == resilience.ErrTotalTimeout:
				err = cause // the handler's deadline cut it, whatever the base made of it
			case errors.Is(ctx.Err(), context.Canceled):
				et = errCanceled // the race's loser, or the caller left
			}
		}
		if et == "" {
			et = spanErrorType(err)
		}
		span.SetAttributes(keyErrType.String(et), keyOutcome.String(outcome(setKey{errType: et}, false)))
		span.SetStatus(codes.Error, err.Error())
		return
	}
	code := resp.StatusCode
	span.SetAttributes(keyStatus.Int(code), keyOutcome.String(outcome(setKey{status: code}, false)))
	switch {
	case code < 100 || code >= 600:
		span.SetAttributes(keyErrType.String(strconv.Itoa(code)))
		span.SetStatus(codes.Error, "invalid HTTP status code "+strconv.Itoa(code))
	case code >= 400:
		span.SetAttributes(keyErrType.String(strconv.Itoa(code)))
		span.SetStatus(codes.Error, "")
	}
}

// methodOther is http.request.method for a method the conventions do not
// know.
const methodOther = "_OTHER"

// semconvMethod returns http.request.method for m, and
// http.request.method_original when it differs from m: "" is GET, as
// net/http sends it, and a known method in another case is that method.
func semconvMethod(m string) (name, original string) {
	if m == "" {
		return http.MethodGet, ""
	}
	if known := method(m); known != methodOther {
		return known, ""
	}
	if upper := strings.ToUpper(m); method(upper) != methodOther {
		return upper, m
	}
	return methodOther, m
}

// appendURL appends the attributes of the URL an attempt is sent to:
// server.address, server.port (the scheme's default when the URL has
// none), and url.full without its userinfo, as otelhttp writes it, and with
// the values of the query parameters the conventions name as secrets
// redacted.
func appendURL(kv []attribute.KeyValue, u *url.URL) []attribute.KeyValue {
	kv = append(kv, keyAddress.String(u.Hostname()))
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	if n, err := strconv.Atoi(port); err == nil {
		kv = append(kv, keyPort.Int(n))
	}
	full := *u
	full.User = nil
	full.RawQuery = redactQuery(full.RawQuery)
	return append(kv, keyURLFull.String(full.String()))
}

// sensitiveQueryKeys are the query parameters whose values url.full must
// not carry, by the conventions: signatures and credentials of signed
// URLs. Keys match case-sensitively, as the conventions say.
var sensitiveQueryKeys = map[string]bool{
	"X-Amz-Signature":      true,
	"X-Amz-Credential":     true,
	"X-Amz-Security-Token": true,
	"sig":                  true,
	"X-Goog-Signature":     true,
}

// redactQuery replaces the values of the sensitive parameters of a raw
// query with "REDACTED", keeping the rest as it was written.
func redactQuery(q string) string {
	if q == "" {
		return q
	}
	pairs := strings.Split(q, "&")
	changed := false
	for i, p := range pairs {
		k, _, hasValue := strings.Cut(p, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if hasValue && sensitiveQueryKeys[k] {
			pairs[i] = p[:strings.IndexByte(p, '=')] + "=REDACTED"
			changed = true
		}
	}
	if !changed {
		return q
	}
	return strings.Join(pairs, "&")
}

// spanErrorType is error.type on an attempt's span, for an attempt that
// failed without a response: the handler's and the context's names, as
// on the metrics; an error's own ErrorType; "timeout"; and otherwise the
// cause's type as otelhttp names one, package path and name without a
// pointer's "*" (such as "net.OpError"); "_OTHER" if there is none.
func spanErrorType(err error) string {
	if s := knownErrorType(err); s != "" {
		return s
	}
	var et interface{ ErrorType() string }
	if errors.As(err, &et) {
		if s := et.ErrorType(); s != "" {
			return s
		}
	}
	if timeout(err) {
		return errTimeout
	}
	if s := typeName(cause(err)); s != "" {
		return s
	}
	return errOther
}

// fmtWrapError is the type of fmt.Errorf's error with one %w, a wrapper
// that says nothing of the failure's class.
var fmtWrapError = reflect.TypeOf(fmt.Errorf("%w", errors.New("")))

// typeName is the package path and name of err's type, under fmt.Errorf's
// wrappers, without a pointer's "*".
func typeName(err error) string {
	for reflect.TypeOf(err) == fmtWrapError {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	t := reflect.TypeOf(err)
	if t == nil {
		return ""
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() == "" || t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
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
		if !m.attemptEvents && m.sendsAttemptsOf(e.Handler) {
			return // its client span says it all
		}
		kv := append(base[:], keyDelay.Float64(e.Delay.Seconds()), keyOutcome.String(outcome(k, false)))
		parent.AddEvent("resilience.attempt", trace.WithAttributes(appendResult(kv, k)...))
	case resilience.EventRetry:
		parent.AddEvent("resilience.retry", trace.WithAttributes(append(base[:],
			keyDelay.Float64(e.Delay.Seconds()), keyReason.String(reason(k)))...))
	case resilience.EventBudgetExceeded:
		kv := append(base[:], keyReason.String(errBudgetExhausted))
		parent.AddEvent("resilience.budget_exceeded", trace.WithAttributes(appendResult(kv, k)...))
	case resilience.EventCircuitRejected:
		parent.AddEvent("resilience.circuit_rejected", trace.WithAttributes(base[:]...))
	case resilience.EventOverloadShed:
		parent.AddEvent("resilience.overload_shed", trace.WithAttributes(appendResult(base[:], k)...))
	case resilience.EventHedge:
		parent.AddEvent("resilience.hedge", trace.WithAttributes(append(base[:],
			keyDelay.Float64(e.Delay.Seconds()))...))
	case resilience.EventHedgeCapped:
		parent.AddEvent("resilience.hedge_capped", trace.WithAttributes(base[:]...))
	case resilience.EventPushback:
		parent.AddEvent("resilience.pushback", trace.WithAttributes(appendResult(base[:], k)...))
	case resilience.EventAttemptHeld:
		parent.AddEvent("resilience.attempt_held", trace.WithAttributes(append(base[:],
			keyDelay.Float64(e.Duration.Seconds()))...))
	case resilience.EventCall:
		kv := append(base[:], keyOutcome.String(outcome(k, true)))
		parent.AddEvent("resilience.call", trace.WithAttributes(appendResult(kv, k)...))
	}
}

// sendsAttempts notes that the handler named name sends its attempts
// through an AttemptTransport, whose spans then say what its EventAttempt
// would. Handler names are few: the set is copied on write, and read
// without a lock.
func (m *Metrics) sendsAttempts(name string) {
	if m.sendsAttemptsOf(name) {
		return
	}
	m.spannedMu.Lock()
	defer m.spannedMu.Unlock()
	old := m.spanned.Load()
	next := make(map[string]bool, 1)
	if old != nil {
		for k := range *old {
			next[k] = true
		}
	}
	next[name] = true
	m.spanned.Store(&next)
}

func (m *Metrics) sendsAttemptsOf(name string) bool {
	p := m.spanned.Load()
	return p != nil && (*p)[name]
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
