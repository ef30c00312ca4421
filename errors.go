package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/redact"
)

// Errors of a Transport, for errors.Is. The error RoundTrip returns wraps
// one and its cause, and names the handler. The timeouts are net.Errors
// whose Timeout is true, and context.DeadlineExceeded.
var (
	// ErrCircuitOpen means the circuit refused the call; the message says why.
	ErrCircuitOpen = errors.New("resilience: circuit open")
	// ErrRateLimited means admission control refused the call.
	ErrRateLimited = errors.New("resilience: rate limited")
	// ErrOverloaded means the limiter refused the call; see OverloadError.
	ErrOverloaded = errors.New("resilience: upstream overloaded")
	// ErrTotalTimeout means the call ran past its total timeout.
	ErrTotalTimeout error = &timeoutError{"resilience: total timeout"}
	// ErrAttemptTimeout means the last attempt got no headers in time.
	ErrAttemptTimeout error = &timeoutError{"resilience: attempt timeout"}
)

// A RateLimitError is the cause under ErrRateLimited when a rate refused the
// call. errors.As finds it in the error RoundTrip returns.
type RateLimitError struct {
	Limit      string        // the rate: "local", "shared" or "server"
	RetryAfter time.Duration // when its next permit is due; 0 if unknown

	// Quota and Resource name the server's quota that refused the call
	// (Limit "server"). Quota is the IETF draft's policy ("default"), or
	// else the fields that announced it, "RateLimit" or "X-RateLimit", or
	// "Retry-After" for a 429's pause. Resource is the resource or
	// partition the quota is scoped to (X-RateLimit-Resource, the draft's
	// partition key), "" for a quota of every call. Both are the
	// upstream's bytes, at most 64 of them.
	Quota, Resource string

	// Response is the upstream's answer that the server's refusal rests
	// on: the one that said nothing was left, or asked for the pause (a 429
	// or 403, as a client library such as go-github reads to build its own
	// rate-limit error), or, when the count kept here ran out before an
	// answer said so, the one that announced the window. It is a copy for
	// this error alone: its Header holds the quota's fields first and at
	// most 4 KiB in all, never Set-Cookie; its Body is http.NoBody; its
	// Request is the request refused. Nil for the other rates.
	Response *http.Response
}

func (e *RateLimitError) Error() string {
	var b strings.Builder
	b.WriteString("resilience: over the " + e.Limit + " rate")
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, ", next permit in %v", e.RetryAfter)
	}
	sep := " ("
	if e.Quota != "" {
		fmt.Fprintf(&b, "%squota %q", sep, e.Quota)
		sep = ", "
	}
	if e.Resource != "" {
		fmt.Fprintf(&b, "%sresource %q", sep, e.Resource)
		sep = ", "
	}
	if e.Response != nil {
		fmt.Fprintf(&b, "%sstatus %d", sep, e.Response.StatusCode)
		sep = ", "
	}
	if sep != " (" {
		b.WriteString(")")
	}
	return b.String()
}

// Is reports whether target is ErrRateLimited.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// timeoutError is the type of the timeout sentinels: code written for
// http.Client checks net.Error.Timeout or context.DeadlineExceeded.
type timeoutError struct{ msg string }

func (e *timeoutError) Error() string   { return e.msg }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

func (e *timeoutError) Is(target error) bool {
	return target == context.DeadlineExceeded
}

// callError is what RoundTrip returns: the handler, the kind (one of the
// sentinels, or nil when the cause alone explains the failure), how many
// attempts were made, and the cause.
type callError struct {
	handler  string
	kind     error
	attempts int
	detail   string
	cause    error
	fault    bool // the request's own failure ended the call (Report.Outcome)
}

func (e *callError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resilience: handler %q:", e.handler)
	if e.kind != nil {
		b.WriteString(" " + strings.TrimPrefix(e.kind.Error(), "resilience: "))
	}
	if e.detail != "" {
		b.WriteString(" " + e.detail)
	}
	if e.attempts > 1 {
		fmt.Fprintf(&b, " after %d attempts", e.attempts)
	}
	if e.cause != nil {
		if e.kind != nil || e.detail != "" || e.attempts > 1 {
			b.WriteString(":")
		}
		b.WriteString(" " + strings.TrimPrefix(e.cause.Error(), "resilience: "))
	}
	return b.String()
}

func (e *callError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// Timeout reports whether the call failed because a deadline passed, ours
// or the caller's, so that url.Error and net.Error checks keep working.
func (e *callError) Timeout() bool {
	var t interface{ Timeout() bool }
	if e.kind != nil && errors.As(e.kind, &t) && t.Timeout() {
		return true
	}
	return e.cause != nil && errors.As(e.cause, &t) && t.Timeout()
}

// Temporary is kept for net.Error; it reports the same as Timeout.
func (e *callError) Temporary() bool { return e.Timeout() }

// ErrorType names the failure's class, for OpenTelemetry's error.type: it
// is what otelhttp records on the span it makes around a Transport, which
// would otherwise name the Go type, "*resilience.callError", for every
// failure. The names are those otelresilience records on an attempt's
// span: "circuit_open", "rate_limited", "overloaded", "total_timeout",
// "attempt_timeout", "canceled" (the caller left), "deadline_exceeded"
// (the caller's deadline: the context's own error, not the base's
// timeouts that say errors.Is context.DeadlineExceeded), the cause's own
// ErrorType if it has one, "timeout" (any other error that says it is
// one), and otherwise the cause's type, as package path and name without
// a pointer's "*", such as "net.OpError". Report.Outcome names the same
// class (callerClass decides both).
func (e *callError) ErrorType() string {
	switch {
	case errors.Is(e, ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(e, ErrRateLimited):
		return "rate_limited"
	case errors.Is(e, ErrOverloaded):
		return "overloaded"
	case errors.Is(e, ErrTotalTimeout):
		return "total_timeout"
	case errors.Is(e, ErrAttemptTimeout):
		return "attempt_timeout"
	}
	switch callerClass(e) {
	case OutcomeCanceled:
		return "canceled"
	case OutcomeDeadlineExceeded:
		return "deadline_exceeded"
	}
	switch {
	case e.cause == nil:
		return "_OTHER"
	}
	var et interface{ ErrorType() string }
	if errors.As(e.cause, &et) {
		if s := et.ErrorType(); s != "" {
			return s
		}
	}
	if e.Timeout() {
		return "timeout"
	}
	return typeName(e.cause)
}

// callerClass returns OutcomeCanceled or OutcomeDeadlineExceeded when err
// is, or wraps, the caller's own reason to leave (callerLeft): a context's
// error or errRequestCanceled, compared as values, as isContextError does;
// and OutcomeNone otherwise. ErrorType and Report.Outcome both class an
// error by it, so that they agree.
func callerClass(err error) Outcome {
	class := OutcomeNone
	redact.Walk(err, func(e error) bool {
		switch e {
		case context.Canceled, errRequestCanceled:
			class = OutcomeCanceled
		case context.DeadlineExceeded:
			class = OutcomeDeadlineExceeded
		default:
			return false
		}
		return true
	})
	return class
}

// fmtWrapError is the type of fmt.Errorf's error with one %w: a wrapper that
// says nothing of the failure's class.
var fmtWrapError = reflect.TypeOf(fmt.Errorf("%w", errors.New("")))

// typeName is the name of err's type, under the wrappers that name no
// class (*url.Error, fmt.Errorf's): package path and name, without a
// pointer's "*", as otelhttp names a type for error.type.
func typeName(err error) string {
	for {
		if ue, ok := err.(*url.Error); ok && ue.Err != nil {
			err = ue.Err
			continue
		}
		if reflect.TypeOf(err) == fmtWrapError {
			if u := errors.Unwrap(err); u != nil {
				err = u
				continue
			}
		}
		break
	}
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() == "" || t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// optionError names the field a user got wrong.
type optionError struct {
	handler string
	field   string
	value   any
	reason  string
}

func (e *optionError) Error() string {
	return fmt.Sprintf("resilience: handler %q: invalid option %s (%v): %s", e.handler, e.field, e.value, e.reason)
}

// A badOption returns the error of an invalid option: its field, the value
// given and why it is wrong.
type badOption func(field string, value any, reason string) error

// ErrBudgetExhausted is the Err of an EventBudgetExceeded, wrapping the
// error not retried, if any; the caller gets that outcome, not this error.
var ErrBudgetExhausted = budget.ErrExhausted
