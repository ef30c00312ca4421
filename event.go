package resilience

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/resilienthttp/resilience/internal/redact"
)

// EventKind says what happened.
type EventKind int

// Event kinds. A change of state is reported once per change; the other
// kinds, once per call or attempt they concern. See docs/observability.md.
const (
	EventRetry               EventKind = iota + 1 // another attempt after Delay
	EventAttemptTimeout                           // no headers within AttemptTimeout
	EventTotalTimeout                             // the call ran out of TotalTimeout
	EventCircuitOpened                            // opened (Err says why) or isolated
	EventCircuitHalfOpened                        // lets a probe through
	EventCircuitClosed                            // closed
	EventCircuitRejected                          // a call refused by the circuit
	EventRateLimited                              // a call refused by admission control
	EventAttempt                                  // an attempt ended, after Duration
	EventCall                                     // a call returned, after Attempt attempts
	EventBudgetExceeded                           // a retry or hedge the budget refused
	EventHedge                                    // a hedge sent, after Delay (on a failure: 0, or its Retry-After's wait)
	EventFallback                                 // a kept response (StatusCode) answered Err
	EventHedgeCapped                              // a hedge not sent: MaxExtraLoad (once a call)
	EventSharedRateFallback                       // the shared rate answers locally (Err: why)
	EventSharedRateRecovered                      // the shared rate answers again
	EventOverloadShed                             // refused or shed (Err: *OverloadError)
	EventOverloaded                               // the overload limiter began refusing
	EventOverloadEnded                            // it has refused nothing for a second
	EventBudgetExhausted                          // the retry budget began refusing (Err: why)
	EventBudgetRecovered                          // half its tokens are unclaimed again
	EventPushback                                 // the upstream said not to retry (PropagationOptions)
	EventAttemptHeld                              // an attempt waited past AttemptTimeout, held as queued (deadlines.holds)
)

var eventKindNames = [...]string{
	EventRetry:               "retry",
	EventAttemptTimeout:      "attempt_timeout",
	EventTotalTimeout:        "total_timeout",
	EventCircuitOpened:       "circuit_opened",
	EventCircuitHalfOpened:   "circuit_half_opened",
	EventCircuitClosed:       "circuit_closed",
	EventCircuitRejected:     "circuit_rejected",
	EventRateLimited:         "rate_limited",
	EventAttempt:             "attempt",
	EventCall:                "call",
	EventBudgetExceeded:      "budget_exceeded",
	EventHedge:               "hedge",
	EventFallback:            "fallback",
	EventHedgeCapped:         "hedge_capped",
	EventSharedRateFallback:  "shared_rate_fallback",
	EventSharedRateRecovered: "shared_rate_recovered",
	EventOverloadShed:        "overload_shed",
	EventOverloaded:          "overloaded",
	EventOverloadEnded:       "overload_ended",
	EventBudgetExhausted:     "budget_exhausted",
	EventBudgetRecovered:     "budget_recovered",
	EventPushback:            "pushback",
	EventAttemptHeld:         "attempt_held",
}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// MarshalText returns the kind's name, as String does.
func (k EventKind) MarshalText() ([]byte, error) {
	if k.String() == "unknown" {
		return nil, fmt.Errorf("resilience: unknown event kind %d", int(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText reads a kind's name, such as "retry" or "circuit_opened".
func (k *EventKind) UnmarshalText(b []byte) error {
	for i, name := range eventKindNames {
		if name != "" && name == string(b) {
			*k = EventKind(i)
			return nil
		}
	}
	return fmt.Errorf("resilience: unknown event kind %q", b)
}

// An Event is something the handler did or saw.
type Event struct {
	Handler    string        // the handler's name
	Host       string        // the authority it concerns, with PerHost or Endpoints
	Kind       EventKind     // what happened
	Method     string        // the request's method, for events about a call
	Attempt    int           // the attempt, from 1; EventCall: how many
	Delay      time.Duration // EventRetry: the wait ahead; EventAttempt: before it
	Duration   time.Duration // EventAttempt and EventCall: how long it took
	StatusCode int           // the response status it concerns, if any
	Err        error         // the error it concerns; EventCircuitOpened: why

	// Endpoint is the base URL, as configured, of the endpoint an attempt
	// went to, or that was passed over, with Endpoints.
	Endpoint string

	// Context is the request's, to tie the event to the caller's trace;
	// nil for an event about no one call, such as the circuit closing.
	Context context.Context

	req *http.Request // the caller's request, for URL
}

// URL returns the URL of the request the event is about, without its
// query, fragment and userinfo (scheme://host/path), or "" for an event
// about no one call. It is computed when asked for, so that an event costs
// nothing for it.
func (e Event) URL() string {
	if e.req == nil || e.req.URL == nil {
		return ""
	}
	u := e.req.URL
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

// defaultLevel is the slog level an event is logged at unless
// Options.LogLevels says otherwise.
func (k EventKind) defaultLevel() slog.Level {
	switch k {
	case EventRetry, EventBudgetExceeded, EventFallback, EventSharedRateFallback, EventOverloaded, EventBudgetExhausted, EventPushback:
		return slog.LevelWarn
	case EventCircuitClosed, EventCircuitHalfOpened, EventHedge, EventHedgeCapped, EventSharedRateRecovered, EventOverloadEnded, EventBudgetRecovered, EventAttemptHeld:
		return slog.LevelInfo
	case EventAttempt, EventCall, EventOverloadShed:
		return slog.LevelDebug
	}
	return slog.LevelError
}

// emit sends an event that concerns no call (the circuit's) to the
// handler's current observers. A call's events go to the observers of the
// options it started under (call.emit).
func (h *Handler) emit(e Event) { h.cfg.Load().emit(e) }

func (cfg *config) emit(e Event) {
	if !cfg.observed {
		return
	}
	e.Handler = cfg.Name
	if cfg.OnEvent != nil {
		cfg.OnEvent(e)
	}
	if cfg.Logger != nil {
		cfg.log(e)
	}
}

func (cfg *config) log(e Event) {
	lvl, ok := cfg.LogLevels[e.Kind]
	if !ok {
		if e.Kind.summarised() {
			cfg.logs.count(e.Kind)
			return
		}
		lvl = e.Kind.defaultLevel()
	}
	l := cfg.Logger
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if !l.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("handler", e.Handler), slog.String("event", e.Kind.String()))
	if e.Host != "" {
		attrs = append(attrs, slog.String("host", e.Host))
	}
	if e.Endpoint != "" {
		attrs = append(attrs, slog.String("endpoint", e.Endpoint))
	}
	if e.Method != "" {
		attrs = append(attrs, slog.String("method", e.Method))
	}
	if e.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	}
	if e.Kind == EventRetry {
		attrs = append(attrs, slog.Duration("delay", e.Delay))
	}
	if e.Kind == EventAttempt || e.Kind == EventCall {
		attrs = append(attrs, slog.Duration("duration", e.Duration))
	}
	if e.StatusCode != 0 {
		attrs = append(attrs, slog.Int("status", e.StatusCode))
	}
	if e.Err != nil {
		// The error may carry an upstream's URL and text it chose: log it
		// with the URL's secrets redacted, escaped and bounded. 4 KiB holds
		// a bounded circuit-open reason with the call's own words around it.
		// The request's URL is redacted wherever the text quotes it, a
		// *url.Error or not.
		const maxLoggedError = 4 << 10
		msg := redact.Error(e.Err)
		if e.req != nil {
			msg = redact.Known(msg, e.req.URL)
		}
		attrs = append(attrs, slog.String("error", redact.Text(msg, maxLoggedError)))
	}
	l.LogAttrs(ctx, lvl, "resilience: "+e.Kind.String(), attrs...)
}

// What a call tells its observers (events) and its caller (errors).

// ended reports the call's outcome to observers, if any, and to the
// caller's Report, if it asked for one; the call checks first that one of
// them hears it (call.heard).
func (c *call) ended(start time.Time, resp *http.Response, err error) {
	if c.wantsReport() {
		// One Report covers every RoundTrip made with its context (each hop
		// of the redirects http.Client follows): counts add up, and the
		// fields that name something name this hop's, the last one.
		r := c.over.report
		r.Outcome, r.StatusCode = c.outcome(resp, err)
		r.Attempts += int(c.attempts)
		if c.cfg.route == nil || c.attempts == 0 { // else routeEnded named the answering endpoint
			r.Endpoint = keyOf(c.req.URL).String()
		}
		if c.keyed {
			r.IdempotencyKey = idempotencyKey(c.req.Header, c.cfg.Idempotency.Header)
		}
	}
	if c.cfg.observed {
		e := Event{Kind: EventCall, Attempt: int(c.attempts), Duration: time.Since(start), Err: err}
		if resp != nil {
			e.StatusCode = resp.StatusCode
		}
		c.emit(e)
	}
}

// outcome is why the call ended with resp or err, as Report.Outcome says
// it, and resp's status. A response is a failure when the retry layer
// judged it one to retry (retryable), or the server's pushback alone
// stopped a retry of a transient status. An error is classed as ErrorType
// classes it, from the error alone: by the handler's sentinels first; then
// by the caller's own reason to leave, which the call's error carries when
// the caller had left by the end of the call (callerFirst); then as the
// request's own fault, which the call's error marks; anything else is the
// transport's.
func (c *call) outcome(resp *http.Response, err error) (Outcome, int) {
	if err == nil {
		if resp == nil {
			return OutcomeNone, 0 // a base that broke the RoundTripper contract
		}
		if c.retryable {
			return OutcomeFailureStatus, resp.StatusCode
		}
		if _, stop, _ := pushbackOf(resp, c.cfg.Propagation); stop && IsTransient(resp, nil) {
			return OutcomeFailureStatus, resp.StatusCode
		}
		return OutcomeSuccess, resp.StatusCode
	}
	switch {
	case errors.Is(err, ErrCircuitOpen):
		return OutcomeCircuitOpen, 0
	case errors.Is(err, ErrRateLimited):
		return OutcomeRateLimited, 0
	case errors.Is(err, ErrOverloaded):
		return OutcomeOverloaded, 0
	case errors.Is(err, ErrTotalTimeout):
		return OutcomeTotalTimeout, 0
	case errors.Is(err, ErrAttemptTimeout):
		return OutcomeAttemptTimeout, 0
	}
	if class := callerClass(err); class != OutcomeNone {
		return class, 0
	}
	if ce, ok := err.(*callError); ok && ce.fault {
		return OutcomeRequestFault, 0
	}
	return OutcomeTransportError, 0
}

// callerFirst returns err, the error the call ends with, made the caller's
// when the caller has left by now and err says neither that nor one of the
// handler's own verdicts (circuit open, rate limited, overloaded, a
// timeout of its own): an attempt that failed on its own just as the
// caller left, or a base that answered the caller's leaving with an error
// of its own. As the request's context is the judge of the caller's
// leaving (DESIGN's classification), the call's error is then the
// context's, still wrapping the attempt's for errors.As; Report.Outcome and
// ErrorType, both read from the error, agree on it.
func (c *call) callerFirst(err error) error {
	if err == nil || callerClass(err) != OutcomeNone {
		return err
	}
	left := c.callerLeft()
	if left == nil || errors.Is(err, ErrCircuitOpen) || errors.Is(err, ErrRateLimited) ||
		errors.Is(err, ErrOverloaded) || errors.Is(err, ErrTotalTimeout) || errors.Is(err, ErrAttemptTimeout) {
		return err
	}
	if ce, ok := err.(*callError); ok && ce.kind == nil {
		ce.kind = left
		return ce
	}
	return c.errorf(left, err, "")
}

// rejected is the error of a call the circuit refused, for reason.
func (c *call) rejected(reason error) error {
	c.emit(Event{Kind: EventCircuitRejected, Attempt: int(c.attempts) + 1, Err: reason})
	detail := ""
	if !c.h.isolated.Load() {
		if d := c.s.circuit.RemainingBreak(); d > 0 {
			detail = fmt.Sprintf("for another %v", d.Round(time.Millisecond))
		}
	}
	return c.errorf(ErrCircuitOpen, reason, "%s", detail)
}

func (c *call) totalTimeout(cause error) error {
	if errors.Is(cause, ErrTotalTimeout) {
		cause = nil // the transport handed back our own cause: nothing to add
	}
	c.emit(Event{Kind: EventTotalTimeout, Err: ErrTotalTimeout})
	return c.errorf(ErrTotalTimeout, cause, "of %v", c.totalLimit)
}

// ended reports attempt a, begun at start, to observers, when its call's
// options have some (config.observed): its status, or its error, or the
// deadline that cut it short. From a hedge's goroutine, a.rec keeps the
// event (record).
func (a *attempt) ended(start time.Time, resp *http.Response, err, deadline error) {
	e := Event{Kind: EventAttempt, Attempt: a.n, Delay: a.delay, Duration: time.Since(start), Err: err}
	switch {
	case deadline != nil:
		e.Err = deadline
	case resp != nil:
		e.StatusCode = resp.StatusCode
	}
	a.record(e)
}

// record records e, an event of attempt a, named by its endpoint if it
// has one (endpoint.label): emitted now on the call's goroutine, or kept
// for it from a hedge's (call.record).
func (a *attempt) record(e Event) {
	if a.ep != nil {
		a.ep.label(&e)
	}
	a.c.record(a.rec, e)
}

// record emits e, an event of the call, or keeps it in rec, when not nil,
// for the call's goroutine to emit: only that goroutine emits the call's
// events and writes its Report (a hedge's goroutine passes its own rec).
func (c *call) record(rec *attemptEvents, e Event) {
	if rec != nil {
		rec.add(e)
		return
	}
	c.emit(e)
}

// attemptEvents are the events of the call that a hedge's goroutine came
// to: it keeps them (call.record), and the race emits them when it
// receives the hedge, so that only the call's own goroutine emits its
// events and writes its Report. A hedge the race never receives, one still
// running when the call returned, is reported by the race itself as it
// returns (settle), and its own events are dropped. A hedge has at most
// three: EventOverloadShed alone, or EventAttemptHeld if it waited past its
// limit, EventAttempt, and then EventAttemptTimeout or EventPushback.
type attemptEvents struct {
	e [3]Event
	n int
}

func (a *attemptEvents) add(e Event) {
	if a.n < len(a.e) {
		a.e[a.n] = e
		a.n++
	}
}

// emit sends an event about this call. Only the call's own goroutine calls
// it (record).
func (c *call) emit(e Event) {
	if c.wantsReport() {
		c.over.report.note(e)
	}
	if !c.cfg.observed {
		return
	}
	c.about(&e)
	if e.Attempt == 0 && e.Kind != EventCall {
		e.Attempt = int(c.attempts)
	}
	c.cfg.emit(e)
}

// about fills in the fields by which e names its call: its request, and
// its host unless e names an endpoint's (endpoint.label).
func (c *call) about(e *Event) {
	e.Method, e.Context, e.req = c.req.Method, c.req.Context(), c.req
	if e.Host == "" {
		e.Host = c.s.host
	}
}

func (c *call) errorf(kind, cause error, format string, args ...any) error {
	return &callError{handler: c.cfg.Name, kind: kind, attempts: int(c.attempts), detail: fmt.Sprintf(format, args...), cause: cause}
}

// faulted is the error of a call that the request's own failure ended:
// its body's reader, a length other than its ContentLength, a request the
// transport refused as malformed (requestFault).
func (c *call) faulted(cause error) error {
	return &callError{handler: c.cfg.Name, attempts: int(c.attempts), cause: cause, fault: true}
}
