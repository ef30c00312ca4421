package resilience

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 29, item 5: a hedge to the server that answered with a Retry-After
// waits it, as a retry does, or goes elsewhere; one that asks for a wait
// the call cannot make gets no further hedge, and when nothing else runs
// the caller gets its answer at once.

// timedUpstream answers each request as script says for its arrival
// number (from 1): "ok", "busy" (a 503), "busy:N" (a 503 with
// Retry-After: N), or "hang" (until the client leaves or the test ends).
// It records when each request arrived and when each answer was written.
type timedUpstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrived  []time.Time
	answered []time.Time
}

func newTimedUpstream(t *testing.T, script func(n int) string) *timedUpstream {
	u := &timedUpstream{}
	stop := make(chan struct{})
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.arrived = append(u.arrived, time.Now())
		n := len(u.arrived)
		u.mu.Unlock()
		what := script(n)
		switch {
		case what == "hang":
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		case what == "busy" || len(what) > 5 && what[:5] == "busy:":
			if what != "busy" {
				w.Header().Set("Retry-After", what[5:])
			}
			u.mu.Lock()
			u.answered = append(u.answered, time.Now())
			u.mu.Unlock()
			http.Error(w, "busy", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, what)
		}
	}))
	t.Cleanup(func() {
		close(stop)
		u.Close()
	})
	return u
}

func (u *timedUpstream) times() (arrived, answered []time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.arrived...), append([]time.Time(nil), u.answered...)
}

func hedgedTransport(t *testing.T, rec *evRecorder, o Options) *Transport {
	t.Helper()
	if o.Hedging == (HedgingOptions{}) {
		o.Hedging = HedgingOptions{Enabled: true, MaxHedges: 2, Delay: time.Hour, MaxExtraLoad: NoExtraLoadCap}
	}
	o.OnEvent = rec.add
	tr, err := NewTransport(&http.Transport{}, o)
	require.NoError(t, err)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func hedgeDelays(rec *evRecorder) []time.Duration {
	var ds []time.Duration
	for _, e := range rec.of(EventHedge) {
		ds = append(ds, e.Delay)
	}
	return ds
}

// A 503 with Retry-After: 1 holds the next hedge to the same host for a
// second, where it went at once.
func TestHedgeWaitsRetryAfter(t *testing.T) {
	up := newTimedUpstream(t, func(n int) string { return map[int]string{1: "busy:1"}[n] + map[bool]string{true: "ok"}[n > 1] })
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{})

	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", readBody(t, resp))
	arrived, answered := up.times()
	require.Len(t, arrived, 2)
	assert.GreaterOrEqual(t, arrived[1].Sub(answered[0]), time.Second, "the hedge waited the Retry-After")
	ds := hedgeDelays(rec)
	require.Len(t, ds, 1)
	assert.Greater(t, ds[0], 900*time.Millisecond, "EventHedge says what it waited")
}

// While an attempt still runs, the hedge a 503 with Retry-After asks for
// waits it, and so does the next speculative hedge on the Delay timer.
func TestHedgeSpeculativeWaitsRetryAfter(t *testing.T) {
	up := newTimedUpstream(t, func(n int) string {
		switch n {
		case 1:
			return "hang"
		case 2:
			return "busy:1"
		}
		return "ok"
	})
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{Hedging: HedgingOptions{Enabled: true, MaxHedges: 3, Delay: 20 * time.Millisecond, MaxExtraLoad: NoExtraLoadCap}})

	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", readBody(t, resp))
	arrived, answered := up.times()
	require.Len(t, arrived, 3, "the first attempt, the hedge that got the 503, the one after its Retry-After")
	assert.GreaterOrEqual(t, arrived[2].Sub(answered[0]), time.Second)
}

// A Retry-After that does not fit in the total timeout, or exceeds
// MaxRetryAfter, ends the hedging: with nothing else running, the caller
// gets the 503, body intact, at once.
func TestHedgeRetryAfterThatDoesNotFit(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"past the total timeout", Options{TotalTimeout: 3 * time.Second}},
		{"over MaxRetryAfter", Options{Retry: RetryOptions{MaxRetryAfter: 500 * time.Millisecond}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newTimedUpstream(t, func(n int) string {
				if n == 1 {
					return "busy:5"
				}
				return "ok"
			})
			if c.name == "over MaxRetryAfter" {
				up = newTimedUpstream(t, func(n int) string {
					if n == 1 {
						return "busy:1"
					}
					return "ok"
				})
			}
			rec := &evRecorder{}
			tr := hedgedTransport(t, rec, c.opts)
			resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
			require.NoError(t, err)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, "busy\n", readBody(t, resp))
			arrived, _ := up.times()
			assert.Len(t, arrived, 1, "no hedge")
			assert.Empty(t, rec.of(EventHedge))
		})
	}
}

// A Retry-After that does not fit while another attempt runs: no further
// hedge goes, and the attempt still running gets its chance.
func TestHedgeRetryAfterThatDoesNotFitWhileAnAttemptRuns(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var n int
	var mu sync.Mutex
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		switch k {
		case 1: // answers 100 ms after the hedge got its 503
			select {
			case <-release:
				_, _ = io.WriteString(w, "late")
			case <-r.Context().Done():
			}
		case 2:
			time.AfterFunc(100*time.Millisecond, func() { once.Do(func() { close(release) }) })
			w.Header().Set("Retry-After", "5")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(up.Close)
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{
		TotalTimeout: 3 * time.Second,
		Hedging:      HedgingOptions{Enabled: true, MaxHedges: 2, Delay: 10 * time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
	})
	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "late", readBody(t, resp), "the first attempt won; no hedge followed the 503")
	assert.Len(t, rec.of(EventHedge), 1)
}

// IgnoreRetryAfter: the next hedge goes at once.
func TestHedgeIgnoreRetryAfter(t *testing.T) {
	up := newTimedUpstream(t, func(n int) string {
		if n == 1 {
			return "busy:5"
		}
		return "ok"
	})
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{TotalTimeout: 3 * time.Second, Retry: RetryOptions{IgnoreRetryAfter: true}})
	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", readBody(t, resp))
	assert.Equal(t, []time.Duration{0}, hedgeDelays(rec))
}

// With Endpoints, a Retry-After holds its own endpoint only: the next hedge
// goes to another at once, and to the one that asked only after its wait.
func TestHedgeRetryAfterPerEndpoint(t *testing.T) {
	t.Run("another endpoint at once", func(t *testing.T) {
		a := newTimedUpstream(t, func(int) string { return "busy:5" })
		b := newTimedUpstream(t, func(int) string { return "b" })
		rec := &evRecorder{}
		tr := hedgedTransport(t, rec, Options{TotalTimeout: 3 * time.Second, Endpoints: []Endpoint{{URL: a.URL}, {URL: b.URL}}})
		_, body := routedGet(t, tr, "http://orders.invalid/")
		assert.Equal(t, "b", body)
		assert.Equal(t, []time.Duration{0}, hedgeDelays(rec))
	})
	t.Run("every endpoint asked for a wait", func(t *testing.T) {
		a := newTimedUpstream(t, func(n int) string {
			if n == 1 {
				return "busy:1"
			}
			return "a"
		})
		b := newTimedUpstream(t, func(int) string { return "busy:1" })
		rec := &evRecorder{}
		tr := hedgedTransport(t, rec, Options{Endpoints: []Endpoint{{URL: a.URL}, {URL: b.URL}}})
		_, body := routedGet(t, tr, "http://orders.invalid/")
		assert.Equal(t, "a", body)
		arrived, answered := a.times()
		require.Len(t, arrived, 2)
		assert.GreaterOrEqual(t, arrived[1].Sub(answered[0]), time.Second, "back to A only after its Retry-After")
	})
	t.Run("an endpoint that did not ask goes first", func(t *testing.T) {
		a := newTimedUpstream(t, func(int) string { return "busy:1" })
		b := newTimedUpstream(t, func(n int) string {
			if n == 1 {
				return "busy"
			}
			return "b"
		})
		c := newTimedUpstream(t, func(int) string { return "busy" })
		rec := &evRecorder{}
		tr := hedgedTransport(t, rec, Options{
			Hedging:   HedgingOptions{Enabled: true, MaxHedges: 3, Delay: time.Hour, MaxExtraLoad: NoExtraLoadCap},
			Endpoints: []Endpoint{{URL: a.URL}, {URL: b.URL}, {URL: c.URL}},
		})
		_, body := routedGet(t, tr, "http://orders.invalid/")
		assert.Equal(t, "b", body, "A, B, C, then B again rather than A within its Retry-After")
		arrived, _ := a.times()
		assert.Len(t, arrived, 1)
		assert.Equal(t, []time.Duration{0, 0, 0}, hedgeDelays(rec))
	})
	t.Run("every endpoint asked for too long a wait", func(t *testing.T) {
		a := newTimedUpstream(t, func(int) string { return "busy:5" })
		b := newTimedUpstream(t, func(int) string { return "busy:5" })
		rec := &evRecorder{}
		tr := hedgedTransport(t, rec, Options{
			TotalTimeout: 3 * time.Second,
			Hedging:      HedgingOptions{Enabled: true, MaxHedges: 3, Delay: time.Hour, MaxExtraLoad: NoExtraLoadCap},
			Endpoints:    []Endpoint{{URL: a.URL}, {URL: b.URL}},
		})
		req, err := http.NewRequest(http.MethodGet, "http://orders.invalid/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "5", resp.Header.Get("Retry-After"))
		resp.Body.Close()
		aa, _ := a.times()
		ba, _ := b.times()
		assert.Equal(t, []int{1, 1}, []int{len(aa), len(ba)}, "one attempt each, then the answer")
	})
}

// With Propagation, the deadline contract's pushback holds the next hedge
// as a Retry-After does.
func TestHedgeWaitsPushback(t *testing.T) {
	var n int
	var mu sync.Mutex
	var answeredAt, againAt time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		k := n
		if k == 2 {
			againAt = time.Now()
		}
		mu.Unlock()
		if k == 1 {
			w.Header().Set("Retry-Pushback-Ms", strconv.Itoa(300))
			mu.Lock()
			answeredAt = time.Now()
			mu.Unlock()
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{Propagation: PropagationOptions{Enabled: true}})
	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", readBody(t, resp))
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, againAt.Sub(answeredAt), 300*time.Millisecond, "the hedge waited the pushback")
}

// A hedge held for a Retry-After that may not go when the wait ends (here
// the circuit was isolated meanwhile) ends the call on the answer it
// waited on, reported as the failure it is.
func TestHedgeHeldHedgeThatMayNotGo(t *testing.T) {
	rec := &evRecorder{}
	tr := hedgedTransport(t, rec, Options{})
	up := newTimedUpstream(t, func(n int) string {
		if n == 1 {
			time.AfterFunc(100*time.Millisecond, tr.Handler().IsolateCircuit)
			return "busy:1"
		}
		return "ok"
	})
	var report Report
	req, err := http.NewRequestWithContext(WithReport(context.Background(), &report), http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "busy\n", readBody(t, resp))
	arrived, _ := up.times()
	assert.Len(t, arrived, 1, "no hedge went")
	assert.Empty(t, rec.of(EventHedge))
	assert.Equal(t, OutcomeFailureStatus, report.Outcome)
}
