package resilience

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 20: the retry budget reports each change of its state once, to
// OnEvent and Logger: exhausted at the first refusal (with why), recovered
// once half its tokens are unclaimed again; the refusals in between are
// EventBudgetExceeded.
func TestBudgetExhaustedAndRecoveredOncePerEpisode(t *testing.T) {
	var failing atomic.Bool
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	rec := &evRecorder{}
	logs := &recordLog{}
	h, err := NewHandler(Options{
		Retry:          quickRetry(),
		RetryBudget:    RetryBudgetOptions{MaxTokens: 2, TokenRatio: 0.5},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		Overload:       OverloadOptions{Disabled: true},
		OnEvent:        rec.add,
		Logger:         slog.New(logs),
	})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	call := func(n int) {
		for range n {
			_, err := evGet(t, tr, up.URL(), http.MethodGet)
			require.NoError(t, err)
		}
	}
	states := func() []EventKind {
		var ks []EventKind
		for _, k := range rec.kinds() {
			if k == EventBudgetExhausted || k == EventBudgetRecovered {
				ks = append(ks, k)
			}
		}
		return ks
	}

	for episode := 1; episode <= 2; episode++ {
		failing.Store(true)
		call(20) // two failed retries empty the bucket; every other retry is refused
		failing.Store(false)
		call(1) // half a token back: not recovered
		require.Len(t, states(), 2*episode-1, "episode %d: %v", episode, states())
		call(1) // one token, half of two: recovered
		call(10)
	}
	assert.Equal(t, []EventKind{EventBudgetExhausted, EventBudgetRecovered, EventBudgetExhausted, EventBudgetRecovered}, states())
	assert.Equal(t, 40, rec.count(EventBudgetExceeded), "each refusal is still an event: 20 calls an episode")
	exhausted := rec.of(EventBudgetExhausted)[0]
	assert.ErrorIs(t, exhausted.Err, ErrBudgetExhausted)
	assert.Contains(t, exhausted.Err.Error(), "recent retries failed")
	assert.Empty(t, exhausted.Host, "the budget is the handler's")
	assert.Nil(t, exhausted.Context, "a change of state is about no one call")

	timer.fire()
	var logged []string
	for _, r := range logs.records() {
		logged = append(logged, r.level.String()+" "+r.msg)
	}
	assert.Equal(t, []string{
		"WARN resilience: budget_exhausted", "INFO resilience: budget_recovered",
		"WARN resilience: budget_exhausted", "INFO resilience: budget_recovered",
		"WARN resilience: retry", "WARN resilience: budget_exceeded",
	}, logged, "each change once; the refusals and retries counted")
	assert.Contains(t, logs.of(EventBudgetExhausted)[0].attrs["error"], "retry budget exhausted (0.0 tokens)")
	assert.Equal(t, 40, logs.counted(t, EventBudgetExceeded))
}

// With PerHost, each host's circuit changes are records of their own,
// naming the host; the rejections of every host are one count.
func TestLogPerHostCircuitChanges(t *testing.T) {
	a := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	b := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	logs := &recordLog{}
	h, err := NewHandler(Options{
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 2, BreakDuration: time.Hour},
		PerHost:        PerHostOptions{Enabled: true},
		Logger:         slog.New(logs),
	})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	for _, up := range []*testUpstream{a, b} {
		for range 2 {
			_, err := evGet(t, tr, up.URL(), http.MethodGet)
			require.NoError(t, err)
		}
		for range 10 {
			_, err := evGet(t, tr, up.URL(), http.MethodGet)
			require.ErrorIs(t, err, ErrCircuitOpen)
		}
	}
	h.CloseCircuit()
	timer.fire()
	var hosts []string
	for _, r := range logs.of(EventCircuitOpened) {
		hosts = append(hosts, r.attrs["host"])
	}
	assert.Equal(t, []string{a.URL(), b.URL()}, hosts, "one opening per host")
	assert.Len(t, logs.of(EventCircuitClosed), 2, "one closing per host")
	assert.Len(t, logs.of(EventCircuitRejected), 1)
	assert.Equal(t, 20, logs.counted(t, EventCircuitRejected))
}

// Every kind, the new state changes included, can be named in a
// configuration file's logLevels.
func TestConfigLogLevelsNameEveryKind(t *testing.T) {
	for k := EventRetry; k.String() != "unknown"; k++ {
		cfg, err := LoadConfig(strings.NewReader(fmt.Sprintf(`{"upstreams": {"a": {"logLevels": {%q: "INFO"}}}}`, k)))
		require.NoError(t, err, "%v", k)
		assert.Equal(t, map[EventKind]slog.Level{k: slog.LevelInfo}, cfg.Upstreams["a"].LogLevels)
	}
}

// summaryTimer stands in for the timer of a handler's log summary: the
// flushes armed wait until fire runs them.
type summaryTimer struct {
	mu      sync.Mutex
	pending []func()
	armed   int
}

// manualSummaryTimer makes t the timer of h's current log summary. It must
// be called before h emits anything.
func manualSummaryTimer(h *Handler) *summaryTimer {
	t := &summaryTimer{}
	h.cfg.Load().logs.after = func(_ time.Duration, f func()) {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.pending = append(t.pending, f)
		t.armed++
	}
	return t
}

// fire runs the flushes armed so far.
func (t *summaryTimer) fire() {
	t.mu.Lock()
	fs := t.pending
	t.pending = nil
	t.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func (t *summaryTimer) timesArmed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.armed
}

// logRecord is a record a recordLog handled.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recordLog is a slog.Handler, at Info unless debug, that keeps every
// record it handles and, when sent is not nil, sends it there too.
type recordLog struct {
	debug bool
	sent  chan logRecord
	mu    sync.Mutex
	got   []logRecord
}

func (l *recordLog) Enabled(_ context.Context, lvl slog.Level) bool {
	return l.debug || lvl >= slog.LevelInfo
}

func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	l.got = append(l.got, rec)
	l.mu.Unlock()
	if l.sent != nil {
		l.sent <- rec
	}
	return nil
}

func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler { panic("not used") }
func (l *recordLog) WithGroup(string) slog.Handler      { panic("not used") }

func (l *recordLog) records() []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logRecord(nil), l.got...)
}

// of returns the records of events of kind k.
func (l *recordLog) of(k EventKind) []logRecord {
	var rs []logRecord
	for _, r := range l.records() {
		if r.attrs["event"] == k.String() {
			rs = append(rs, r)
		}
	}
	return rs
}

// counted adds up the counts of the summary records of kind k.
func (l *recordLog) counted(t *testing.T, k EventKind) int {
	t.Helper()
	n := 0
	for _, r := range l.of(k) {
		c, err := strconv.Atoi(r.attrs["count"])
		require.NoError(t, err, "a summary record has a count: %+v", r)
		n += c
	}
	return n
}

// Issue 20: an open circuit under 1,000 rejected calls is one record of
// its opening and a summary of the rejections, not 1,000 ERROR records;
// OnEvent still hears of every one.
func TestLogOpenCircuitSummarisesRejections(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	logs := &recordLog{}
	rec := &evRecorder{}
	h, err := NewHandler(Options{
		Name:           "pricing",
		Retry:          RetryOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 2, BreakDuration: time.Hour},
		Logger:         slog.New(logs),
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	for range 2 {
		status, err := evGet(t, tr, up.URL(), http.MethodGet)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
	}
	require.Equal(t, CircuitOpen, h.CircuitState())
	for range 1000 {
		_, err := evGet(t, tr, up.URL(), http.MethodGet)
		require.ErrorIs(t, err, ErrCircuitOpen)
	}
	assert.Equal(t, 1000, rec.count(EventCircuitRejected), "OnEvent gets every rejection")
	assert.Len(t, logs.records(), 1, "before the interval ends, only the opening is logged: %+v", logs.records())
	assert.Equal(t, 1, timer.timesArmed(), "one flush is armed for the interval")
	timer.fire()

	opened := logs.of(EventCircuitOpened)
	require.Len(t, opened, 1)
	assert.Equal(t, slog.LevelError, opened[0].level)
	assert.Equal(t, "resilience: circuit_opened", opened[0].msg)
	assert.Contains(t, opened[0].attrs["error"], "2 of 2 attempts failed", "the opening says why")
	rejected := logs.of(EventCircuitRejected)
	require.Len(t, rejected, 1)
	assert.Equal(t, slog.LevelError, rejected[0].level, "at the level the kind had")
	assert.Equal(t, "resilience: circuit_rejected", rejected[0].msg)
	assert.Equal(t, map[string]string{"handler": "pricing", "event": "circuit_rejected", "count": "1000", "interval": "10s"}, rejected[0].attrs)
	assert.Equal(t, 1000, logs.counted(t, EventCircuitRejected))
	assert.Len(t, logs.records(), 2, "%+v", logs.records())

	// The next interval is armed by its first event, and counts afresh.
	for range 3 {
		_, err := evGet(t, tr, up.URL(), http.MethodGet)
		require.ErrorIs(t, err, ErrCircuitOpen)
	}
	assert.Equal(t, 2, timer.timesArmed())
	timer.fire()
	assert.Equal(t, 1003, logs.counted(t, EventCircuitRejected))
	timer.fire()
	assert.Len(t, logs.records(), 3, "a flush with nothing counted logs nothing")
}

// The last interval's count is flushed by the handler's own timer, with no
// event after it to trigger the flush; no goroutine is left (goleak).
func TestLogSummaryFlushesTheLastInterval(t *testing.T) {
	logs := &recordLog{sent: make(chan logRecord, 100)}
	h, err := NewHandler(Options{Logger: slog.New(logs)})
	require.NoError(t, err)
	h.cfg.Load().logs.every = time.Millisecond // the real timer, soon
	h.IsolateCircuit()
	opened := <-logs.sent
	assert.Equal(t, "circuit_opened", opened.attrs["event"])
	tr := h.Transport(&http.Transport{})
	for range 50 {
		_, err := evGet(t, tr, "http://127.0.0.1:1/", http.MethodGet)
		require.ErrorIs(t, err, ErrCircuitOpen)
	}
	// However the 50 fall into intervals, their counts arrive, the last
	// with no call after it.
	for n := 0; n < 50; {
		r := <-logs.sent
		require.Equal(t, "circuit_rejected", r.attrs["event"])
		c, err := strconv.Atoi(r.attrs["count"])
		require.NoError(t, err)
		n += c
		require.LessOrEqual(t, n, 50)
	}
}

// Counts made from many goroutines while flushes run are all logged, once.
func TestLogSummaryConcurrentCounts(t *testing.T) {
	logs := &recordLog{}
	h, err := NewHandler(Options{Logger: slog.New(logs)})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	cfg := h.cfg.Load()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 500 {
				cfg.emit(Event{Kind: EventRetry})
			}
		}()
		go func() {
			defer wg.Done()
			for range 50 {
				timer.fire()
			}
		}()
	}
	wg.Wait()
	timer.fire()
	assert.Equal(t, 4000, logs.counted(t, EventRetry))
	assert.LessOrEqual(t, len(logs.records()), timer.timesArmed())
}

// The escape hatch: a kind listed in LogLevels is logged one record per
// event, at the level listed, with the call's details, and not summarised.
func TestLogLevelsOptInLogsEachEvent(t *testing.T) {
	logs := &recordLog{}
	h, err := NewHandler(Options{
		Logger:    slog.New(logs),
		LogLevels: map[EventKind]slog.Level{EventCircuitRejected: slog.LevelWarn},
	})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	h.IsolateCircuit()
	tr := h.Transport(&http.Transport{})
	for range 20 {
		_, err := evGet(t, tr, "http://127.0.0.1:1/", http.MethodGet)
		require.ErrorIs(t, err, ErrCircuitOpen)
	}
	rejected := logs.of(EventCircuitRejected)
	require.Len(t, rejected, 20, "one record per rejection")
	for _, r := range rejected {
		assert.Equal(t, slog.LevelWarn, r.level)
		assert.Equal(t, "GET", r.attrs["method"])
		assert.Contains(t, r.attrs["error"], "isolated")
		assert.NotContains(t, r.attrs, "count")
	}
	assert.Zero(t, timer.timesArmed(), "nothing to summarise")
}

// EventAttempt and EventCall stay one record each at Debug, logged only by
// a logger that enables Debug.
func TestLogAttemptsAndCallsAtDebug(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	for _, debug := range []bool{false, true} {
		logs := &recordLog{debug: debug}
		h, err := NewHandler(Options{Logger: slog.New(logs)})
		require.NoError(t, err)
		timer := manualSummaryTimer(h)
		tr := h.Transport(&http.Transport{})
		for range 3 {
			_, err := evGet(t, tr, up.URL(), http.MethodGet)
			require.NoError(t, err)
		}
		tr.CloseIdleConnections()
		timer.fire()
		if !debug {
			assert.Empty(t, logs.records())
			continue
		}
		assert.Len(t, logs.of(EventAttempt), 3)
		assert.Len(t, logs.of(EventCall), 3)
		for _, r := range logs.records() {
			assert.Equal(t, slog.LevelDebug, r.level)
			assert.NotEmpty(t, r.attrs["duration"])
		}
	}
}

// A summarised kind the logger would drop at its level is not counted, and
// arms nothing.
func TestLogSummarySkipsDisabledLevels(t *testing.T) {
	logs := &recordLog{}
	h, err := NewHandler(Options{Logger: slog.New(logs)})
	require.NoError(t, err)
	timer := manualSummaryTimer(h)
	h.cfg.Load().emit(Event{Kind: EventOverloadShed}) // Debug
	assert.Zero(t, timer.timesArmed())
	h.cfg.Load().emit(Event{Kind: EventHedge}) // Info
	assert.Equal(t, 1, timer.timesArmed())
	timer.fire()
	assert.Len(t, logs.records(), 1)
	assert.Equal(t, slog.LevelInfo, logs.of(EventHedge)[0].level)
}

// Counts made under a Logger are logged to it, even after an Update gives
// the handler another.
func TestLogSummaryAcrossUpdate(t *testing.T) {
	before, after := &recordLog{}, &recordLog{}
	h, err := NewHandler(Options{Logger: slog.New(before)})
	require.NoError(t, err)
	t1 := manualSummaryTimer(h)
	h.cfg.Load().emit(Event{Kind: EventRetry})
	require.NoError(t, h.Update(Options{Logger: slog.New(after)}))
	t2 := manualSummaryTimer(h)
	h.cfg.Load().emit(Event{Kind: EventRetry})
	h.cfg.Load().emit(Event{Kind: EventRetry})
	t1.fire()
	t2.fire()
	assert.Equal(t, 1, before.counted(t, EventRetry))
	assert.Equal(t, 2, after.counted(t, EventRetry))
}

// secretURL is a request URL with every kind of secret a URL carries: a
// password, a username (which may be the credential), a token in the query
// and one in the fragment.
const secretURL = "http://erin:s3cr3t-pw@api.example:8080/items/7?token=T0KEN-123&x=1#frag-S3"

var urlSecrets = []string{"s3cr3t-pw", "erin", "T0KEN-123", "frag-S3"}

// secretErrors are errors whose text contains secretURL, as a *url.Error
// (net/http's), as plain text a RoundTripper wrote, quoted, and wrapped.
func secretErrors() []error {
	ue := &url.Error{Op: "Get", URL: secretURL, Err: syscall.ECONNREFUSED}
	return []error{
		ue,
		fmt.Errorf("upstream %s: connection refused", secretURL),
		fmt.Errorf("fetching %q: %w", secretURL, io.ErrUnexpectedEOF),
		fmt.Errorf("attempt 2: %w", ue),
		&callError{handler: "h", kind: ErrTotalTimeout, cause: fmt.Errorf("reading %s: %w", secretURL, ue)},
	}
}

// assertNoSecrets fails t if any record of logs shows a secret of
// secretURL, and returns how many records there were.
func assertNoSecrets(t *testing.T, logs *recordLog) int {
	t.Helper()
	recs := logs.records()
	for _, r := range recs {
		for k, v := range r.attrs {
			for _, s := range urlSecrets {
				assert.NotContains(t, v, s, "%s of %s", k, r.msg)
			}
		}
		for _, s := range urlSecrets {
			assert.NotContains(t, r.msg, s)
		}
	}
	return len(recs)
}

// Issue 20: no kind of event puts a URL's secrets into the log, whether
// logged one record per event (LogLevels) or summarised, whatever error
// text quotes the request's URL.
func TestLogNeverShowsURLSecrets(t *testing.T) {
	req, err := http.NewRequest(http.MethodGet, secretURL, nil)
	require.NoError(t, err)
	var kinds []EventKind
	for k := EventRetry; k.String() != "unknown"; k++ {
		kinds = append(kinds, k)
	}
	for _, each := range []bool{false, true} {
		t.Run(fmt.Sprintf("each=%v", each), func(t *testing.T) {
			logs := &recordLog{debug: true}
			opts := Options{Logger: slog.New(logs)}
			if each {
				opts.LogLevels = map[EventKind]slog.Level{}
				for _, k := range kinds {
					opts.LogLevels[k] = slog.LevelInfo
				}
			}
			h, err := NewHandler(opts)
			require.NoError(t, err)
			timer := manualSummaryTimer(h)
			cfg := h.cfg.Load()
			for _, k := range kinds {
				for _, err := range secretErrors() {
					cfg.emit(Event{Kind: k, Host: keyOf(req.URL).String(), Method: req.Method, Attempt: 1, StatusCode: 503,
						Err: err, Context: req.Context(), req: req})
				}
			}
			timer.fire()
			n := assertNoSecrets(t, logs)
			if each {
				assert.Equal(t, len(kinds)*len(secretErrors()), n, "every event was logged")
				for _, r := range logs.records() {
					assert.Contains(t, r.attrs["error"], "http://api.example:8080/items/7?redacted", "the error still says which URL: %s", r.attrs["error"])
				}
			} else {
				assert.Positive(t, n)
			}
		})
	}
}

// secretTransport fails every request with one of secretErrors' kinds of
// error text about the request's own URL.
type secretTransport struct{ n atomic.Int64 }

func (s *secretTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL.String()
	switch s.n.Add(1) % 3 {
	case 0:
		return nil, &url.Error{Op: req.Method, URL: u, Err: syscall.ECONNREFUSED}
	case 1:
		return nil, fmt.Errorf("upstream %s: connection refused", u)
	}
	return nil, fmt.Errorf("fetching %q: %w", u, io.ErrUnexpectedEOF)
}

// End to end: the secrets of a request's URL quoted by its attempts' errors
// reach neither the reason the circuit opened on, in its record and in
// the rejections', nor any other record.
func TestLogCircuitReasonHasNoURLSecrets(t *testing.T) {
	for _, each := range []bool{false, true} {
		t.Run(fmt.Sprintf("each=%v", each), func(t *testing.T) {
			logs := &recordLog{debug: true}
			opts := Options{
				Retry:          quickRetry(),
				CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 6, BreakDuration: time.Hour},
				Overload:       OverloadOptions{Disabled: true},
				Logger:         slog.New(logs),
			}
			if each {
				opts.LogLevels = map[EventKind]slog.Level{EventRetry: slog.LevelInfo, EventCircuitRejected: slog.LevelInfo}
			}
			h, err := NewHandler(opts)
			require.NoError(t, err)
			timer := manualSummaryTimer(h)
			tr := h.Transport(&secretTransport{})
			for range 5 {
				_, err := evGet(t, tr, secretURL, http.MethodGet)
				require.Error(t, err)
			}
			require.Equal(t, CircuitOpen, h.CircuitState())
			timer.fire()
			assertNoSecrets(t, logs)
			opened := logs.of(EventCircuitOpened)
			require.Len(t, opened, 1)
			assert.Contains(t, opened[0].attrs["error"], "6 of 6 attempts failed")
			assert.Contains(t, opened[0].attrs["error"], "upstream http://api.example:8080/items/7?redacted#redacted: connection refused")
			assert.Contains(t, opened[0].attrs["error"], `fetching "http://api.example:8080/items/7?redacted#redacted"`)
			if each {
				assert.NotEmpty(t, logs.of(EventRetry))
				assert.NotEmpty(t, logs.of(EventCircuitRejected))
			}
		})
	}
}
