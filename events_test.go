package resilience

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evRecorder collects the events a handler emits; its add method is an
// Options.OnEvent. The other test files of this theme reuse it. It skips
// EventAttempt and EventCall, which every call emits, unless measures is
// set: their own tests look at them.
type evRecorder struct {
	mu       sync.Mutex
	events   []Event
	measures bool
}

func (r *evRecorder) add(e Event) {
	if (e.Kind == EventAttempt || e.Kind == EventCall) && !r.measures {
		return
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *evRecorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func (r *evRecorder) kinds() []EventKind {
	var ks []EventKind
	for _, e := range r.all() {
		ks = append(ks, e.Kind)
	}
	return ks
}

func (r *evRecorder) of(kind EventKind) []Event {
	var es []Event
	for _, e := range r.all() {
		if e.Kind == kind {
			es = append(es, e)
		}
	}
	return es
}

func (r *evRecorder) count(kind EventKind) int { return len(r.of(kind)) }

// evUpstream answers each request with the next status of its script, then
// with 200; it counts requests.
type evUpstream struct {
	*httptest.Server
	hits   atomic.Int64
	mu     sync.Mutex
	script []int
}

func evNewUpstream(script ...int) *evUpstream {
	u := &evUpstream{script: script}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		status := http.StatusOK
		u.mu.Lock()
		if len(u.script) > 0 {
			status, u.script = u.script[0], u.script[1:]
		}
		u.mu.Unlock()
		w.WriteHeader(status)
		_, _ = w.Write([]byte("payload"))
	}))
	return u
}

func evGet(t *testing.T, tr http.RoundTripper, url, method string) (int, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		assert.Nil(t, resp)
		return 0, err
	}
	defer resp.Body.Close()
	_, err = evReadAll(resp)
	require.NoError(t, err)
	return resp.StatusCode, nil
}

func evReadAll(resp *http.Response) (string, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(resp.Body)
	return b.String(), err
}

func TestEventKindString(t *testing.T) {
	want := map[EventKind]string{
		EventRetry:             "retry",
		EventAttemptTimeout:    "attempt_timeout",
		EventTotalTimeout:      "total_timeout",
		EventCircuitOpened:     "circuit_opened",
		EventCircuitHalfOpened: "circuit_half_opened",
		EventCircuitClosed:     "circuit_closed",
		EventCircuitRejected:   "circuit_rejected",
		EventRateLimited:       "rate_limited",
		EventBudgetExhausted:   "budget_exhausted",
		EventBudgetRecovered:   "budget_recovered",
		EventKind(0):           "unknown",
		EventKind(99):          "unknown",
	}
	for k, s := range want {
		assert.Equal(t, s, k.String(), "EventKind(%d)", int(k))
	}
}

func TestEventsCarryCallDetails(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Name:           "billing",
		Retry:          RetryOptions{Delay: time.Millisecond, NoJitter: true, MaxRetries: 1},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 2, SamplingDuration: time.Minute, BreakDuration: time.Minute},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	// 503, retry, 503: the breaker opens on the second attempt, and the
	// caller gets the last 503.
	status, err := evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)

	// Rejected by the open circuit.
	_, err = evGet(t, tr, up.URL, http.MethodGet)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.EqualValues(t, 2, up.hits.Load())

	assert.Equal(t, []EventKind{EventRetry, EventCircuitOpened, EventCircuitRejected}, rec.kinds())
	for _, e := range rec.all() {
		assert.Equal(t, "billing", e.Handler, "every event names its handler: %+v", e)
	}
	retry := rec.of(EventRetry)[0]
	assert.Equal(t, http.MethodGet, retry.Method)
	assert.Equal(t, 1, retry.Attempt)
	assert.Equal(t, http.StatusServiceUnavailable, retry.StatusCode)
	assert.Equal(t, time.Millisecond, retry.Delay)
	assert.NoError(t, retry.Err)

	opened := rec.of(EventCircuitOpened)[0]
	assert.Equal(t, 0, opened.Attempt, "circuit transitions are not about an attempt")
	require.Error(t, opened.Err)
	assert.Contains(t, opened.Err.Error(), "2 of 2 attempts failed")
	assert.Contains(t, opened.Err.Error(), "503")

	rejected := rec.of(EventCircuitRejected)[0]
	assert.Equal(t, http.MethodGet, rejected.Method)
	assert.Equal(t, 1, rejected.Attempt)
	require.Error(t, rejected.Err)
	assert.Contains(t, rejected.Err.Error(), "503")
}

func TestEventAttemptTimeoutCarriesError(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			select { // hang the first attempt until the client gives up on it
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	defer close(release)
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Name:                 "slow",
		AttemptTimeout:       20 * time.Millisecond,
		StrictAttemptTimeout: true, // cut at its limit though nothing overtook it
		Retry:                RetryOptions{Delay: time.Millisecond, NoJitter: true},
		CircuitBreaker:       CircuitBreakerOptions{Disabled: true},
		OnEvent:              rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	status, err := evGet(t, tr, srv.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, []EventKind{EventAttemptTimeout, EventRetry}, rec.kinds())
	for _, e := range rec.all() {
		assert.Equal(t, "slow", e.Handler)
		assert.Equal(t, http.MethodGet, e.Method)
		assert.Equal(t, 1, e.Attempt)
		assert.ErrorIs(t, e.Err, ErrAttemptTimeout)
		assert.Zero(t, e.StatusCode)
	}
}

// evLogLines returns a logger writing text to a buffer, without times, and
// a function returning the lines logged so far, one per event.
func evLogLines(t *testing.T) (*slog.Logger, func() []string) {
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	w := evWriterFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.LevelInfo, // attempts and calls are logged at debug
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
	return l, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Split(strings.TrimSpace(buf.String()), "\n")
	}
}

type evWriterFunc func([]byte) (int, error)

func (f evWriterFunc) Write(p []byte) (int, error) { return f(p) }

func TestEventsLoggedAtLevels(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	defer up.Close()
	logger, lines := evLogLines(t)
	h, err := NewHandler(Options{
		Name:           "logged",
		Retry:          RetryOptions{Delay: time.Millisecond, NoJitter: true, MaxRetries: 1},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 2, SamplingDuration: time.Minute, BreakDuration: time.Minute},
		Logger:         logger,
	})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	status, err := evGet(t, tr, up.URL, http.MethodGet) // retry, then opens
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	h.CloseCircuit()
	assert.Equal(t, CircuitClosed, h.CircuitState())
	timer.fire() // the retry's count

	got := lines()
	require.Len(t, got, 3, "%q", got)
	assert.Contains(t, got[0], "level=ERROR")
	assert.Contains(t, got[0], "event=circuit_opened")
	assert.Contains(t, got[0], "handler=logged")
	assert.Contains(t, got[0], "2 of 2 attempts failed")
	assert.Contains(t, got[1], "level=INFO")
	assert.Contains(t, got[1], "event=circuit_closed")
	assert.Contains(t, got[2], "level=WARN")
	assert.Contains(t, got[2], "event=retry")
	assert.Contains(t, got[2], "handler=logged")
	assert.Contains(t, got[2], "count=1 interval=10s")
	for _, l := range got {
		assert.Contains(t, l, `msg="resilience: `)
	}
}

func TestEventsLoggerRespectsLevel(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	var buf bytes.Buffer
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:          RetryOptions{Delay: time.Millisecond, NoJitter: true},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		Logger:         slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	status, err := evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Empty(t, buf.String(), "a retry is a warning, below the logger's level")
}

func TestEventsWithoutObservers(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	defer up.Close()
	h, err := NewHandler(Options{
		Retry:          RetryOptions{Delay: time.Millisecond, NoJitter: true, MaxRetries: 1},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 2, SamplingDuration: time.Minute, BreakDuration: time.Minute},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	require.NotPanics(t, func() {
		status, err := evGet(t, tr, up.URL, http.MethodGet)
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, status)
		_, err = evGet(t, tr, up.URL, http.MethodGet)
		assert.ErrorIs(t, err, ErrCircuitOpen)
		h.IsolateCircuit()
		h.CloseCircuit()
	})
	assert.Equal(t, CircuitClosed, h.CircuitState())
	assert.EqualValues(t, 2, up.hits.Load())
}

func TestEventKindErrorsWrapCause(t *testing.T) {
	// The sentinel used for isolation is what rejections carry.
	rec := &evRecorder{}
	h, err := NewHandler(Options{OnEvent: rec.add})
	require.NoError(t, err)
	h.IsolateCircuit()
	h.IsolateCircuit() // a second isolation is not a second event
	require.Equal(t, 1, rec.count(EventCircuitOpened))
	assert.True(t, errors.Is(rec.of(EventCircuitOpened)[0].Err, ErrIsolated))
	h.CloseCircuit()
	assert.Equal(t, []EventKind{EventCircuitOpened, EventCircuitClosed}, rec.kinds())
}

// Every attempt and every call is reported with its duration, which is what
// metrics are built from: 2 retries then success is three attempts, one call.
func TestEventsMeasureAttemptsAndCalls(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	defer up.Close()
	rec := &evRecorder{measures: true}
	tr, err := NewTransport(&http.Transport{}, Options{Name: "measured", Retry: RetryOptions{Delay: time.Millisecond, NoJitter: true}, OnEvent: rec.add})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	status, err := evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)

	attempts := rec.of(EventAttempt)
	require.Len(t, attempts, 3)
	for i, e := range attempts {
		assert.Equal(t, i+1, e.Attempt)
		assert.Equal(t, "measured", e.Handler)
		assert.Equal(t, http.MethodGet, e.Method)
		assert.Positive(t, e.Duration)
	}
	assert.Equal(t, []int{503, 503, 200}, []int{attempts[0].StatusCode, attempts[1].StatusCode, attempts[2].StatusCode})
	calls := rec.of(EventCall)
	require.Len(t, calls, 1)
	assert.Equal(t, 3, calls[0].Attempt, "the call reports how many attempts it made")
	assert.Equal(t, http.StatusOK, calls[0].StatusCode)
	assert.GreaterOrEqual(t, calls[0].Duration, attempts[0].Duration+attempts[1].Duration+attempts[2].Duration)
	assert.Equal(t, []EventKind{EventAttempt, EventRetry, EventAttempt, EventRetry, EventAttempt, EventCall}, rec.kinds())
}

// A call refused before any attempt is still a call, of zero attempts.
func TestEventsMeasureRejectedCall(t *testing.T) {
	rec := &evRecorder{measures: true}
	h, err := NewHandler(Options{OnEvent: rec.add})
	require.NoError(t, err)
	h.IsolateCircuit()
	_, err = evGet(t, h.Transport(&http.Transport{}), "http://127.0.0.1:1/", http.MethodGet)
	require.ErrorIs(t, err, ErrCircuitOpen)
	calls := rec.of(EventCall)
	require.Len(t, calls, 1)
	assert.Zero(t, calls[0].Attempt, "the attempt the circuit refused was never made")
	assert.ErrorIs(t, calls[0].Err, ErrCircuitOpen)
	assert.Empty(t, rec.of(EventAttempt), "nothing was sent")
}

func TestEventsLogLevelsOverride(t *testing.T) {
	up := evNewUpstream(http.StatusServiceUnavailable)
	defer up.Close()
	var buf bytes.Buffer
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:     RetryOptions{Delay: time.Millisecond},
		Logger:    slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})),
		LogLevels: map[EventKind]slog.Level{EventRetry: slog.LevelError, EventCall: slog.LevelError},
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	_, err = evGet(t, tr, up.URL, http.MethodGet)
	require.NoError(t, err)
	assert.Contains(t, buf.String(), "level=ERROR msg=\"resilience: retry\"", "the retry is raised to error")
	assert.Contains(t, buf.String(), "level=ERROR msg=\"resilience: call\"")
	assert.NotContains(t, buf.String(), "msg=\"resilience: attempt\"", "attempts stay at debug")

	_, err = NewHandler(Options{LogLevels: map[EventKind]slog.Level{EventKind(99): slog.LevelInfo}})
	require.ErrorContains(t, err, "LogLevels")
}

func TestEventKindText(t *testing.T) {
	for k := EventRetry; k <= EventAttemptHeld; k++ {
		b, err := k.MarshalText()
		require.NoError(t, err)
		var back EventKind
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, k, back)
	}
	assert.Equal(t, "unknown", (EventAttemptHeld + 1).String(), "the last kind is the last named")
	var k EventKind
	assert.Error(t, k.UnmarshalText([]byte("retries")))
	_, err := EventKind(0).MarshalText()
	assert.Error(t, err)
}

// Issue 13: an event carries the caller's request context, so that it can be
// tied to the caller's trace, and the request's URL without its secrets;
// slog records are written with that context.
func TestEventsCarryTheRequestContext(t *testing.T) {
	type key struct{}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	var mu sync.Mutex
	var events []Event
	handler := &ctxHandler{key: key{}}
	h, err := NewHandler(Options{
		Retry:     quickRetry(),
		Logger:    slog.New(handler),
		LogLevels: map[EventKind]slog.Level{EventAttempt: slog.LevelInfo, EventRetry: slog.LevelWarn}, // each logged
		OnEvent: func(e Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	ctx := context.WithValue(context.Background(), key{}, "trace-4bf92f35")
	u := strings.Replace(up.URL(), "http://", "http://user:secret@", 1) + "/items/7?apiKey=SECRET#frag"
	resp, err := tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, u, nil))
	require.NoError(t, err)
	readBody(t, resp)

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, events)
	for _, e := range events {
		require.NotNil(t, e.Context, "%v", e.Kind)
		assert.Equal(t, "trace-4bf92f35", e.Context.Value(key{}), "%v", e.Kind)
		assert.Equal(t, up.URL()+"/items/7", e.URL(), "%v: no query, fragment or userinfo", e.Kind)
	}
	assert.Equal(t, "", Event{}.URL())
	assert.Equal(t, []any{"trace-4bf92f35", "trace-4bf92f35", "trace-4bf92f35"}, handler.values(),
		"every slog record (attempt, retry, attempt, and the call is DEBUG) has the request's context")
}

// ctxHandler is a slog.Handler that records a context value of every
// record it handles.
type ctxHandler struct {
	key any
	mu  sync.Mutex
	got []any
}

func (h *ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		return nil
	}
	h.mu.Lock()
	h.got = append(h.got, ctx.Value(h.key))
	h.mu.Unlock()
	return nil
}
func (h *ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *ctxHandler) WithGroup(string) slog.Handler      { return h }
func (h *ctxHandler) values() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]any(nil), h.got...)
}
