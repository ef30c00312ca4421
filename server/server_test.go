package server

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/internal/contract"
)

// A fakeClock is the window's clock in tests: it moves only when told.
type fakeClock struct {
	base time.Time
	ns   atomic.Int64
}

func newFakeClock() *fakeClock               { return &fakeClock{base: time.Now()} }
func (c *fakeClock) now() time.Time          { return c.base.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// build is New that fails the test on an error, with the window's clock
// set to clk when it is not nil.
func build(t *testing.T, next http.Handler, o Options, clk *fakeClock) *handler {
	t.Helper()
	hh, err := New(next, o)
	require.NoError(t, err)
	h := hh.(*handler)
	if clk != nil && h.win != nil {
		h.win.now, h.win.start = clk.now, clk.now()
	}
	return h
}

// events collects the events of a handler.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) add(ev Event) { e.mu.Lock(); e.all = append(e.all, ev); e.mu.Unlock() }

func (e *events) list() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.all...)
}

// answer is what a client saw.
type answer struct {
	status   int
	pushback []string
	body     string
}

// send makes one request to url with the given header fields, each a name
// and its values, and returns its answer.
func send(t *testing.T, client *http.Client, url string, fields ...any) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i < len(fields); i += 2 {
		name := fields[i].(string)
		switch v := fields[i+1].(type) {
		case string:
			req.Header[name] = []string{v}
		case []string:
			req.Header[name] = v
		}
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header.Values(contract.PushbackHeader), string(body)}
}

// seen is what a handler saw of its request's context.
type seen struct {
	called   bool
	deadline time.Time
	has      bool
}

// recorder returns a handler that records the deadline of each request it
// serves, for requests made one at a time.
func recorder() (http.Handler, func() seen) {
	var mu sync.Mutex
	var last seen
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		mu.Lock()
		last = seen{true, dl, ok}
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	return h, func() seen {
		mu.Lock()
		defer mu.Unlock()
		s := last
		last = seen{}
		return s
	}
}

var (
	hundredKiB = strings.Repeat("7", 100<<10)
	tenTo30    = "1" + strings.Repeat("0", 30)
)

// The hostile budget headers, against a running server, with and without
// a deadline of the server's own on the request: none extends a deadline,
// none panics, each is ignored, clamped or read as documented.
func TestHostileBudgetHeaders(t *testing.T) {
	cases := []hostileCase{
		{"absent", nil, ignored, 0},
		{"empty", []string{""}, ignored, 0},
		{"negative", []string{"-5"}, ignored, 0},
		{"1e30", []string{"1e30"}, ignored, 0},
		{"10^30 in 31 digits", []string{tenTo30}, ignored, 0},
		{"non-numeric", []string{"abc"}, ignored, 0},
		{"plus sign", []string{"+5"}, ignored, 0},
		{"two values", []string{"250", "250"}, ignored, 0},
		{"a list in one field", []string{"250, 300"}, ignored, 0},
		{"100 KiB", []string{hundredKiB}, ignored, 0},
		// net/http removes the whitespace around a field value on the wire
		// (RFC 9110 section 5.5), so these arrive as "5"; the middleware
		// itself ignores them (TestHostileBudgetValuesDirect).
		{"leading space", []string{" 5"}, read, 5 * time.Millisecond},
		{"trailing space", []string{"5 "}, read, 5 * time.Millisecond},
		{"huge, 11 digits", []string{"99999999999"}, clamped, contract.MaxBudget},
		{"huge, 19 digits", []string{strings.Repeat("9", 19)}, clamped, contract.MaxBudget},
		{"250 ms", []string{"250"}, read, 250 * time.Millisecond},
		{"0: spent", []string{"0"}, refused, 0},
	}
	for _, parent := range []time.Duration{0, time.Minute} {
		t.Run("server deadline "+parent.String(), func(t *testing.T) {
			testHostile(t, parent, cases)
		})
	}
}

type hostileCase struct {
	name   string
	values []string // nil: no field
	what   int
	want   time.Duration
}

const (
	ignored = iota
	clamped
	read    // the budget given as want
	refused // spent: 503, next not called
)

func testHostile(t *testing.T, parent time.Duration, cases []hostileCase) {
	next, last := recorder()
	mw := build(t, next, Options{}, nil)
	var parentDeadline atomic.Pointer[time.Time]
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if parent > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), parent)
			defer cancel()
			dl, _ := ctx.Deadline()
			parentDeadline.Store(&dl)
			r = r.WithContext(ctx)
		}
		mw.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(outer)
	defer srv.Close()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := time.Now()
			var a answer
			if c.values == nil {
				a = send(t, srv.Client(), srv.URL)
			} else {
				a = send(t, srv.Client(), srv.URL, contract.BudgetHeader, c.values)
			}
			after := time.Now()
			s := last()
			if c.what == refused {
				assert.Equal(t, http.StatusServiceUnavailable, a.status)
				assert.Equal(t, []string{contract.PushbackStop}, a.pushback)
				assert.False(t, s.called, "refused before any work")
				return
			}
			require.Equal(t, http.StatusOK, a.status, a.body)
			require.True(t, s.called)
			assert.Empty(t, a.pushback, "a served request carries no pushback")
			if parent > 0 {
				pd := *parentDeadline.Load()
				require.True(t, s.has)
				assert.False(t, s.deadline.After(pd), "the header extended the server's own deadline")
				if c.what != read {
					assert.Equal(t, pd, s.deadline, "the server's deadline stays")
					return
				}
			}
			switch c.what {
			case ignored:
				assert.False(t, s.has, "an ignored budget adds no deadline")
			case clamped, read:
				require.True(t, s.has)
				assert.False(t, s.deadline.Before(before.Add(c.want)), "deadline %v, want at least %v", s.deadline, before.Add(c.want))
				assert.False(t, s.deadline.After(after.Add(c.want)), "deadline %v, want at most %v", s.deadline, after.Add(c.want))
			}
		})
	}
}

// The middleware itself, without net/http's parsing in front: each value
// as it is in r.Header.
func TestHostileBudgetValuesDirect(t *testing.T) {
	for _, values := range [][]string{
		{}, {""}, {" 5"}, {"5 "}, {"+5"}, {"-5"}, {"1e30"}, {tenTo30}, {"abc"},
		{"5", "6"}, {hundredKiB}, {"5\r\n"}, {"\x00"}, {"٥"},
	} {
		var got context.Context
		base := context.Background()
		h := build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r.Context()
		}), Options{}, nil)
		r := httptest.NewRequestWithContext(base, http.MethodGet, "/", nil)
		r.Header[contract.BudgetHeader] = values
		w := httptest.NewRecorder()
		require.NotPanics(t, func() { h.ServeHTTP(w, r) })
		assert.Equal(t, http.StatusOK, w.Code, "%q", values)
		assert.True(t, got == base, "%q: the request's context is untouched", values)
	}
}

func TestBudgetOnContext(t *testing.T) {
	var during error
	var got context.Context
	h := build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Context()
		during = got.Err()
	}), Options{}, nil)

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set(contract.BudgetHeader, "60000")
	before := time.Now()
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.NotNil(t, got)
	dl, ok := got.Deadline()
	require.True(t, ok)
	assert.False(t, dl.Before(before.Add(time.Minute)))
	assert.NoError(t, during, "the budget is not spent while next runs")
	assert.ErrorIs(t, got.Err(), context.Canceled, "cancelled once next has returned")
	assert.NoError(t, r.Context().Err(), "the caller's own context is left alone")

	// A parent deadline shorter than the budget wins.
	parent, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pd, _ := parent.Deadline()
	r = httptest.NewRequestWithContext(parent, http.MethodGet, "/", nil)
	r.Header.Set(contract.BudgetHeader, "60000")
	h.ServeHTTP(httptest.NewRecorder(), r)
	dl, ok = got.Deadline()
	require.True(t, ok)
	assert.Equal(t, pd, dl)
	assert.NoError(t, parent.Err(), "the parent is not cancelled with the budget's context")

	// A budget shorter than the parent's deadline wins.
	r = httptest.NewRequestWithContext(parent, http.MethodGet, "/", nil)
	r.Header.Set(contract.BudgetHeader, "100")
	h.ServeHTTP(httptest.NewRecorder(), r)
	dl, _ = got.Deadline()
	assert.True(t, dl.Before(pd))
}

// A handler that calls another service on the request's context hands the
// smaller budget on: here the budget a client half would read from it.
func TestBudgetPassedOn(t *testing.T) {
	leafNext, leafSeen := recorder()
	leaf := httptest.NewServer(build(t, leafNext, Options{}, nil))
	defer leaf.Close()
	front := httptest.NewServer(build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, _ := r.Context().Deadline()
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, leaf.URL, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header.Set(contract.BudgetHeader, contract.FormatBudget(time.Until(dl)))
		resp, err := leaf.Client().Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	}), Options{}, nil))
	defer front.Close()

	before := time.Now()
	a := send(t, front.Client(), front.URL, contract.BudgetHeader, "30000")
	require.Equal(t, http.StatusOK, a.status, a.body)
	s := leafSeen()
	require.True(t, s.has)
	assert.False(t, s.deadline.After(time.Now().Add(30*time.Second)))
	assert.False(t, s.deadline.Before(before.Add(29*time.Second)), "a second is more than two loopback hops take")
}

func TestSpentAndBelowFloorRefused(t *testing.T) {
	for _, c := range []struct {
		name     string
		min      time.Duration
		budget   string
		served   bool
		eventFor time.Duration
	}{
		{"spent", 0, "0", false, 0},
		{"below the default floor", 0, "4", false, 4 * time.Millisecond},
		{"at the default floor", 0, "5", true, 0},
		{"below a floor of 100ms", 100 * time.Millisecond, "99", false, 99 * time.Millisecond},
		{"at a floor of 100ms", 100 * time.Millisecond, "100", true, 0},
		{"no floor: spent still refused", -1, "0", false, 0},
		{"no floor: 1ms served", -1, "1", true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			var ev events
			srv := httptest.NewServer(build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
			}), Options{MinBudget: c.min, OnEvent: ev.add}, nil))
			defer srv.Close()
			a := send(t, srv.Client(), srv.URL, contract.BudgetHeader, c.budget, contract.AttemptHeader, "1")
			if c.served {
				assert.Equal(t, http.StatusOK, a.status)
				assert.Equal(t, int32(1), calls.Load())
				assert.Empty(t, ev.list())
				return
			}
			assert.Equal(t, http.StatusServiceUnavailable, a.status)
			assert.Equal(t, []string{"-1"}, a.pushback, "a spent budget is not worth a retry")
			assert.Contains(t, a.body, "budget")
			assert.Zero(t, calls.Load(), "refused before next")
			assert.Equal(t, []Event{{Kind: EventExpired, Attempt: 1, Budget: c.eventFor, Stop: true}}, ev.list())
		})
	}
}

func TestRetryShare(t *testing.T) {
	clk := newFakeClock()
	var ev events
	var calls atomic.Int32
	srv := httptest.NewServer(build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	}), Options{OnEvent: ev.add}, clk))
	defer srv.Close()
	first := func() answer { return send(t, srv.Client(), srv.URL, contract.AttemptHeader, "1") }
	retry := func() answer { return send(t, srv.Client(), srv.URL, contract.AttemptHeader, "2") }

	// A trickle of retries alone is not refused: fewer than 20 served.
	for range 19 {
		require.Equal(t, http.StatusOK, retry().status)
	}
	clk.advance(time.Second) // the window empties

	for range 100 {
		require.Equal(t, http.StatusOK, first().status)
	}
	served, refused := 0, 0
	for range 20 {
		switch a := retry(); a.status {
		case http.StatusOK:
			served++
			assert.Empty(t, a.pushback)
		case http.StatusServiceUnavailable:
			refused++
			assert.Equal(t, []string{contract.PushbackStop}, a.pushback)
		default:
			t.Fatalf("status %d", a.status)
		}
	}
	// Retries are served while at most a tenth of what was served was
	// retries: 12 of 112 is the first share above it.
	assert.Equal(t, 12, served)
	assert.Equal(t, 8, refused)
	assert.Equal(t, int32(19+100+12), calls.Load(), "a refused retry does no work")
	evs := ev.list()
	require.Len(t, evs, 8)
	for _, e := range evs {
		assert.Equal(t, EventRetryRefused, e.Kind)
		assert.Equal(t, 2, e.Attempt)
		assert.True(t, e.Stop)
		assert.InDelta(t, 12.0/112, e.Share, 1e-9, "refused retries are not counted")
	}

	// First attempts are never refused for the share, and as they are
	// served the share falls and retries are served again: the refusals
	// did not feed the share.
	for range 10 {
		require.Equal(t, http.StatusOK, first().status)
	}
	assert.Equal(t, http.StatusOK, retry().status, "13 of 123 served: 12 of 122 were retries")
	assert.Equal(t, http.StatusServiceUnavailable, retry().status, "14 of 124 would be more than a tenth")

	// The window slides: a second later, the share is of what came since.
	clk.advance(time.Second)
	for range 20 {
		require.Equal(t, http.StatusOK, retry().status, "the trickle again")
	}
}

func TestRetryShareBelowThreshold(t *testing.T) {
	var ev events
	srv := httptest.NewServer(build(t, http.NotFoundHandler(), Options{OnEvent: ev.add}, newFakeClock()))
	defer srv.Close()
	for range 100 {
		require.Equal(t, http.StatusNotFound, send(t, srv.Client(), srv.URL).status)
	}
	for range 10 {
		require.Equal(t, http.StatusNotFound, send(t, srv.Client(), srv.URL, contract.AttemptHeader, "3").status)
	}
	assert.Empty(t, ev.list())
}

func TestRetryShareOff(t *testing.T) {
	h := build(t, http.NotFoundHandler(), Options{RetryShare: -1}, nil)
	assert.Nil(t, h.win, "no window is kept")
	for range 50 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set(contract.AttemptHeader, "2")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusNotFound, w.Code)
	}
}

// The window moves bucket by bucket: what was served more than Window ago
// is forgotten a tenth at a time.
func TestWindowSlides(t *testing.T) {
	clk := newFakeClock()
	w := newWindow(time.Second)
	w.now, w.start = clk.now, clk.now()
	for i := range 10 { // a retry in each bucket
		if i > 0 {
			clk.advance(100 * time.Millisecond)
		}
		ok, _ := w.admit(true, 0.1)
		require.True(t, ok)
	}
	for range 30 {
		ok, _ := w.admit(false, 0.1)
		require.True(t, ok)
	}
	// 40 served in the window, 10 of them retries.
	assert.InDelta(t, 0.25, w.share(), 1e-9)
	clk.advance(100 * time.Millisecond) // the first retry's bucket leaves
	assert.InDelta(t, 9.0/39, w.share(), 1e-9)
	clk.advance(500 * time.Millisecond)
	assert.InDelta(t, 4.0/34, w.share(), 1e-9)
	clk.advance(time.Hour)
	assert.Zero(t, w.share())
	clk.ns.Store(0) // a clock that goes back does not bring old counts back
	assert.Zero(t, w.share())
	assert.Zero(t, testing.AllocsPerRun(100, func() { w.admit(true, 0.1) }), "admit allocates")
}

func TestMaxConcurrent(t *testing.T) {
	var ev events
	entered := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered <- struct{}{}
			<-release
		}
	}), Options{MaxConcurrent: 10, RetryShare: -1, OnEvent: ev.add}, nil))
	defer srv.Close()

	var wg sync.WaitGroup
	statuses := make(chan int, 10)
	block := func() {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/block", nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
		<-entered
	}
	defer func() { // on a failure too, so that nothing is left blocked
		select {
		case <-release:
		default:
			close(release)
		}
		wg.Wait()
	}()
	for range 9 {
		block()
	}
	// 9 in flight: the limit less the reserve of 1. A retry is refused, and
	// told not to retry; a first attempt is served.
	a := send(t, srv.Client(), srv.URL, contract.AttemptHeader, "2")
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.Equal(t, []string{contract.PushbackStop}, a.pushback)
	block()
	// 10 in flight: a first attempt is refused too, without the stop: it
	// may be retried elsewhere.
	a = send(t, srv.Client(), srv.URL, contract.AttemptHeader, "1")
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.Empty(t, a.pushback)
	a = send(t, srv.Client(), srv.URL)
	assert.Equal(t, http.StatusServiceUnavailable, a.status)

	assert.Equal(t, []Event{
		{Kind: EventOverloaded, Attempt: 2, InFlight: 9, Stop: true},
		{Kind: EventOverloaded, Attempt: 1, InFlight: 10},
		{Kind: EventOverloaded, Attempt: 0, InFlight: 10},
	}, ev.list())

	close(release)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		assert.Equal(t, http.StatusOK, s)
	}
	assert.Equal(t, http.StatusOK, send(t, srv.Client(), srv.URL, contract.AttemptHeader, "2").status, "the slots are free again")
}

func TestReserve(t *testing.T) {
	for _, c := range []struct{ max, reserve int64 }{
		{1, 0}, {2, 1}, {10, 1}, {19, 1}, {20, 2}, {100, 10}, {1000, 100},
	} {
		h := build(t, http.NotFoundHandler(), Options{MaxConcurrent: int(c.max)}, nil)
		assert.Equal(t, c.reserve, h.reserve, "MaxConcurrent %d", c.max)
	}
	// With a limit of 1 there is no room for a reserve: a retry is served
	// when nothing else is in flight.
	h := build(t, http.NotFoundHandler(), Options{MaxConcurrent: 1}, nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set(contract.AttemptHeader, "2")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusNotFound, w.Code)
}

// A slot is given back when next panics, and the budget's context is
// cancelled.
func TestPanicReleases(t *testing.T) {
	var got context.Context
	h := build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Context()
		panic(http.ErrAbortHandler)
	}), Options{MaxConcurrent: 1}, nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set(contract.BudgetHeader, "1000")
	assert.Panics(t, func() { h.ServeHTTP(httptest.NewRecorder(), r) })
	assert.Zero(t, h.inflight.Load())
	assert.ErrorIs(t, got.Err(), context.Canceled)
}

func TestEnvoyHeaders(t *testing.T) {
	next, last := recorder()
	var ev events
	srv := httptest.NewServer(build(t, next, Options{Headers: EnvoyHeaders(), OnEvent: ev.add}, nil))
	defer srv.Close()

	// Envoy sends its names in lower case, as HTTP/2 would.
	a := send(t, srv.Client(), srv.URL, "x-envoy-expected-rq-timeout-ms", "0", "x-envoy-attempt-count", "3")
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.Equal(t, []string{"-1"}, a.pushback, "the neutral pushback header")
	assert.Equal(t, []Event{{Kind: EventExpired, Attempt: 3, Stop: true}}, ev.list())

	// The neutral names mean nothing under Envoy's.
	a = send(t, srv.Client(), srv.URL, contract.BudgetHeader, "0")
	assert.Equal(t, http.StatusOK, a.status)
	assert.False(t, last().has)

	assert.Equal(t, Headers{"X-Envoy-Expected-Rq-Timeout-Ms", "X-Envoy-Attempt-Count", "Retry-Pushback-Ms"}, EnvoyHeaders())
	assert.Equal(t, Headers{"Request-Budget-Ms", "Request-Attempt", "Retry-Pushback-Ms"}, DefaultHeaders())
}

func TestCustomHeaders(t *testing.T) {
	h := build(t, http.NotFoundHandler(), Options{Headers: Headers{Budget: "deadline-ms", Pushback: "no-retry"}}, nil)
	assert.Equal(t, "Deadline-Ms", h.budget, "canonical")
	assert.Equal(t, contract.AttemptHeader, h.attempt, "an empty name is the default's")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Deadline-Ms", "0")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "-1", w.Header().Get("No-Retry"))
	assert.Empty(t, w.Header().Get(contract.PushbackHeader))
}

func TestBadOptions(t *testing.T) {
	next := http.NotFoundHandler()
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Window: -time.Second}, "Window"},
		{Options{Window: time.Millisecond}, "Window"},
		{Options{MaxConcurrent: -1}, "MaxConcurrent"},
		{Options{RetryShare: 1.5}, "RetryShare"},
		{Options{RetryShare: math.NaN()}, "RetryShare"},
		{Options{RetryShare: math.Inf(1)}, "RetryShare"},
		{Options{MinBudget: 25 * time.Hour}, "MinBudget"},
		{Options{Headers: Headers{Budget: "two words"}}, "Headers.Budget"},
		{Options{Headers: Headers{Attempt: "a:b"}}, "Headers.Attempt"},
		{Options{Headers: Headers{Pushback: "x\n"}}, "Headers.Pushback"},
		{Options{Headers: Headers{Budget: "request-attempt"}}, "Headers.Budget"}, // the field written, not the default it meets
	} {
		h, err := New(next, c.o)
		assert.Nil(t, h)
		if assert.Error(t, err, c.field) {
			assert.True(t, strings.HasPrefix(err.Error(), "resilience: server: invalid option "+c.field+" ("), err.Error())
		}
	}
	_, err := New(nil, Options{})
	assert.EqualError(t, err, "resilience: server: nil next handler")

	for _, o := range []Options{
		{}, {RetryShare: -1}, {RetryShare: math.Inf(-1)}, {RetryShare: 1}, {MinBudget: -1},
		{MinBudget: 24 * time.Hour}, {Window: 10 * time.Millisecond}, {Window: 1000 * time.Hour}, {Headers: EnvoyHeaders()},
	} {
		_, err := New(next, o)
		assert.NoError(t, err, "%+v", o)
	}
}

func TestEventKindString(t *testing.T) {
	assert.Equal(t, "expired", EventExpired.String())
	assert.Equal(t, "retry_refused", EventRetryRefused.String())
	assert.Equal(t, "overloaded", EventOverloaded.String())
	assert.Equal(t, "unknown", EventKind(0).String())
	assert.Equal(t, "unknown", EventKind(99).String())
	assert.Equal(t, "unknown", EventKind(-1).String())
}

// Many requests at once, with every kind of header, through every rule:
// the race detector watches, and every slot comes back.
func TestConcurrent(t *testing.T) {
	var refusals atomic.Int64
	h := build(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		Options{MaxConcurrent: 4, OnEvent: func(Event) { refusals.Add(1) }}, nil)
	budgets := []string{"", "0", "3", "250", "abc", tenTo30}
	attempts := []string{"", "1", "2", "7", "-1"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set(contract.BudgetHeader, budgets[(g+i)%len(budgets)])
				r.Header.Set(contract.AttemptHeader, attempts[(g*7+i)%len(attempts)])
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, h.inflight.Load())
	assert.NotZero(t, refusals.Load(), "the spent budgets at least")
}

// No header value makes the middleware panic, extend the deadline, or
// pass on a deadline past MaxBudget.
func FuzzServe(f *testing.F) {
	for _, s := range []string{"", "0", "5", "250", "-1", "+5", " 5", "1e30", tenTo30, strings.Repeat("9", 19)} {
		f.Add(s, "2")
	}
	h, err := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parent := r.Context().Value(parentKey{}).(time.Time)
		if dl, ok := r.Context().Deadline(); !ok || dl.After(parent) {
			panic("the deadline was extended")
		}
	}), Options{})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, budget, attempt string) {
		ctx, cancel := context.WithTimeout(context.Background(), contract.MaxBudget/2)
		defer cancel()
		dl, _ := ctx.Deadline()
		r := httptest.NewRequestWithContext(context.WithValue(ctx, parentKey{}, dl), http.MethodGet, "/", nil)
		r.Header[contract.BudgetHeader] = []string{budget}
		r.Header[contract.AttemptHeader] = []string{attempt}
		h.ServeHTTP(httptest.NewRecorder(), r)
	})
}

type parentKey struct{}
