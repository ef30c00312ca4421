package resilience

import (
	"bytes"
	"context"
	"io"
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

// hedgeUpstream answers each request with the behaviour its arrival number
// selects, records bodies, and reports requests cancelled by the client.
type hedgeUpstream struct {
	*httptest.Server
	hits      atomic.Int64
	cancelled atomic.Int64
	release   chan struct{}
	once      sync.Once
	mu        sync.Mutex
	bodies    []string
}

// behaviour n: "hang" waits for the client to give up or release, "503"
// fails at once, anything else is the 200 body.
func newHedgeUpstream(behaviour func(n int64) string) *hedgeUpstream {
	u := &hedgeUpstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		switch what := behaviour(n); what {
		case "hang":
			select {
			case <-r.Context().Done():
				u.cancelled.Add(1)
			case <-u.release:
				_, _ = io.WriteString(w, "late")
			}
		case "503":
			http.Error(w, "busy", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, what)
		}
	}))
	return u
}

func (u *hedgeUpstream) unblock() { u.once.Do(func() { close(u.release) }) }

func hedgeOptions(rec *evRecorder, delay time.Duration) Options {
	return Options{
		Name:    "hedged",
		Hedging: HedgingOptions{Enabled: true, MaxHedges: 2, Delay: delay, MaxExtraLoad: NoExtraLoadCap},
		OnEvent: rec.add,
	}
}

func hedgeGet(t *testing.T, tr http.RoundTripper, method, url string, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	return tr.RoundTrip(req)
}

// A slow first attempt is overtaken by a hedge sent after Delay; the loser
// is cancelled and the winner's body is read after the call returned.
func TestHedgeOvertakesSlowAttempt(t *testing.T) {
	up := newHedgeUpstream(func(n int64) string {
		if n == 1 {
			return "hang"
		}
		return strings.Repeat("fast", 10000)
	})
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, hedgeOptions(rec, 20*time.Millisecond))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, strings.Repeat("fast", 10000), string(body), "the winner's body is intact")
	assert.EqualValues(t, 2, up.hits.Load())
	require.Eventually(t, func() bool { return up.cancelled.Load() == 1 }, 5*time.Second, time.Millisecond, "the loser was cancelled")
	hedges := rec.of(EventHedge)
	require.Len(t, hedges, 1)
	assert.Equal(t, 2, hedges[0].Attempt)
	assert.Equal(t, 20*time.Millisecond, hedges[0].Delay)
}

// A handled failure does not win while another attempt runs, and sends the
// next hedge at once rather than after Delay.
func TestHedgeFailureSendsNextAtOnce(t *testing.T) {
	up := newHedgeUpstream(func(n int64) string {
		if n == 1 {
			return "503"
		}
		return "ok"
	})
	defer up.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, hedgeOptions(rec, time.Hour))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err, "an hour's Delay was not waited")
	assert.Equal(t, "ok", readBody(t, resp))
	hedges := rec.of(EventHedge)
	require.Len(t, hedges, 1)
	assert.Zero(t, hedges[0].Delay, "sent on the failure, not after Delay")
}

// When every attempt fails, the caller gets the last failure: a response,
// intact, with a nil error.
func TestHedgeAllFail(t *testing.T) {
	up := newHedgeUpstream(func(int64) string { return "503" })
	defer up.Close()
	tr, err := NewTransport(&http.Transport{}, hedgeOptions(&evRecorder{}, time.Hour))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "busy\n", readBody(t, resp))
	assert.EqualValues(t, 3, up.hits.Load(), "the first attempt and MaxHedges more")
}

// Only methods safe to repeat are hedged.
func TestHedgeMethodRule(t *testing.T) {
	for _, tc := range []struct {
		method  string
		ctx     func(context.Context) context.Context
		hedged  bool
		methods []string
	}{
		{method: http.MethodGet, hedged: true},
		{method: http.MethodHead, hedged: false}, // one rule with retries: GET by default
		{method: http.MethodOptions, hedged: false},
		{method: http.MethodHead, hedged: true, methods: []string{http.MethodHead}},
		{method: http.MethodPost, hedged: false},
		{method: http.MethodPut, hedged: false},
		{method: http.MethodPut, hedged: true, methods: []string{http.MethodPut}},
		{method: http.MethodPost, hedged: true, ctx: func(ctx context.Context) context.Context { return WithRetryable(ctx, true) }},
		{method: http.MethodGet, hedged: false, ctx: func(ctx context.Context) context.Context { return WithRetryable(ctx, false) }},
	} {
		up := newHedgeUpstream(func(int64) string { return "503" })
		o := hedgeOptions(&evRecorder{}, time.Hour)
		o.Retry.Methods = tc.methods
		tr, err := NewTransport(&http.Transport{}, o)
		require.NoError(t, err)
		req, err := http.NewRequest(tc.method, up.URL, bytes.NewReader([]byte("payload")))
		require.NoError(t, err)
		if tc.ctx != nil {
			req = req.WithContext(tc.ctx(req.Context()))
		}
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		want := int64(1)
		if tc.hedged {
			want = 3
		}
		assert.Equal(t, want, up.hits.Load(), "%s %v: attempts", tc.method, tc.methods)
		tr.CloseIdleConnections()
		up.Close()
	}
}

// Each attempt sends its own copy of the body: from GetBody, or from the
// bounded buffer; a body too large to buffer is sent once and not hedged.
func TestHedgeBodies(t *testing.T) {
	up := newHedgeUpstream(func(int64) string { return "503" })
	defer up.Close()
	o := hedgeOptions(&evRecorder{}, time.Hour)
	o.Retry.Methods = []string{http.MethodPut}
	o.MaxBufferedBody = 16
	o.RetryBudget.Disabled = true // every attempt fails here: the budget would stop the hedges
	tr, err := NewTransport(&http.Transport{}, o)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	resp, err := hedgeGet(t, tr, http.MethodPut, up.URL, strings.NewReader("with GetBody")) // NewRequest sets GetBody
	require.NoError(t, err)
	resp.Body.Close()
	resp, err = hedgeGet(t, tr, http.MethodPut, up.URL, io.MultiReader(strings.NewReader("short"))) // no GetBody, buffered
	require.NoError(t, err)
	resp.Body.Close()
	long := strings.Repeat("x", 100)
	resp, err = hedgeGet(t, tr, http.MethodPut, up.URL, io.MultiReader(strings.NewReader(long))) // no GetBody, too long
	require.NoError(t, err)
	resp.Body.Close()

	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, []string{"with GetBody", "with GetBody", "with GetBody", "short", "short", "short", long}, up.bodies)
}

// Hedges draw on the retry budget as retries do: a hedge that fails takes a
// token (the first attempt's failure costs nothing), and with no token left
// no hedge is sent. With 3 tokens and every attempt failing: the first call
// makes 3 attempts (3 -> 1 token), the second 2 (-> 0, its third refused),
// the third 1 (refused at once).
func TestHedgeBudget(t *testing.T) {
	up := newHedgeUpstream(func(int64) string { return "503" })
	defer up.Close()
	rec := &evRecorder{}
	opts := hedgeOptions(rec, time.Hour)
	opts.RetryBudget.MaxTokens = 3
	tr, err := NewTransport(&http.Transport{}, opts)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	var hits []int64
	for range 3 {
		resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the last failure")
		resp.Body.Close()
		hits = append(hits, up.hits.Load())
	}
	assert.Equal(t, []int64{3, 5, 6}, hits)
	assert.Equal(t, 3, rec.count(EventHedge))
	assert.Equal(t, 2, rec.count(EventBudgetExceeded))
	assert.Zero(t, tr.Handler().budget.Level())
}

func TestHedgeTotalTimeoutAndCircuit(t *testing.T) {
	up := newHedgeUpstream(func(int64) string { return "hang" })
	defer up.Close()
	defer up.unblock()
	o := hedgeOptions(&evRecorder{}, time.Millisecond)
	o.TotalTimeout, o.AttemptTimeout = 50*time.Millisecond, -1
	h, err := NewHandler(o)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	_, err = hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.ErrorIs(t, err, ErrTotalTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 3, up.hits.Load())

	h.IsolateCircuit()
	_, err = hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.EqualValues(t, 3, up.hits.Load(), "nothing sent")
}

func TestHedgingDefaultsAndValidation(t *testing.T) {
	tr, err := NewTransport(nil, Options{Hedging: HedgingOptions{Enabled: true}})
	require.NoError(t, err)
	assert.Equal(t, defaultMaxHedges, tr.Handler().cfg.Load().Hedging.MaxHedges)
	assert.Equal(t, defaultHedgingDelay, tr.Handler().cfg.Load().Hedging.Delay)
	for _, o := range []HedgingOptions{{MaxHedges: 11}, {MaxHedges: -1}, {Delay: -time.Second}} {
		o.Enabled = true
		_, err := NewTransport(nil, Options{Hedging: o})
		require.ErrorContains(t, err, "Hedging.")
	}
}

// Issue 8, item 14: a hedge the budget refuses is reported once per call,
// not again at every hedge point the call passes. The budget is empty, so
// each hedge that follows a failure (a retry) is refused; the speculative
// hedges sent while the first attempt hangs are not the budget's to refuse
// (issue 18, item 8). Attempts 2 to 4 fail in turn, each asking for a hedge
// the budget refuses; once the fourth has been sent the first answers.
func TestHedgeBudgetRefusalReportedOncePerCall(t *testing.T) {
	up := newHedgeUpstream(func(n int64) string {
		if n == 1 {
			return "hang"
		}
		return "503"
	})
	defer up.Close()
	defer up.unblock()
	rec := &evRecorder{}
	o := hedgeOptions(rec, 2*time.Millisecond)
	o.Hedging.MaxHedges = 3
	h, err := NewHandler(o)
	require.NoError(t, err)
	for h.budget.Level() > 0 { // an empty budget: every retry is refused
		h.budget.ClaimAnyway()
		h.budget.Record(false, true)
	}
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	go func() {
		for deadline := time.Now().Add(5 * time.Second); up.hits.Load() < 4 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond) // the bound only matters if hedges are refused
		}
		up.unblock()
	}()
	resp, err := hedgeGet(t, tr, http.MethodGet, up.URL, nil)
	require.NoError(t, err)
	assert.Equal(t, "late", readBody(t, resp))
	assert.EqualValues(t, 4, up.hits.Load(), "three speculative hedges")
	assert.Equal(t, 3, rec.count(EventHedge))
	require.Equal(t, 1, rec.count(EventBudgetExceeded), "refused after attempts 2 and 3, reported once")
	assert.Contains(t, rec.of(EventBudgetExceeded)[0].Err.Error(), "recent retries failed")
}

// Issue 8, item 14: the winner of a hedged call never waits while a kept
// failure's body drains: the loser is drained in the background.
func TestHedgeWinnerDoesNotWaitForLoserDrain(t *testing.T) {
	stop := make(chan struct{})
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			// A 503 whose body trickles: draining it takes httpbody.MaxDrainTime.
			w.WriteHeader(http.StatusServiceUnavailable)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	defer close(stop)
	spy := &closeSpy{base: &http.Transport{}, closed: make(chan struct{})}
	defer spy.base.CloseIdleConnections()
	tr, err := NewTransport(spy, hedgeOptions(&evRecorder{}, time.Hour))
	require.NoError(t, err)

	resp, err := hedgeGet(t, tr, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	select {
	case <-spy.closed:
		assert.Fail(t, "the winner was returned only after the loser's drain had ended")
	default:
	}
	assert.Equal(t, "ok", readBody(t, resp))
	<-spy.closed // the background drain ends it
}

// closeSpy is a base RoundTripper that reports when the body of a 503 is
// closed.
type closeSpy struct {
	base   *http.Transport
	closed chan struct{}
}

func (s *closeSpy) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		resp.Body = &spiedBody{ReadCloser: resp.Body, closed: s.closed}
	}
	return resp, err
}

// spiedBody reports its first Close: a drain cut short by its time bound
// closes the body, and then the drain closes it again.
type spiedBody struct {
	io.ReadCloser
	closed chan struct{}
	once   sync.Once
}

func (b *spiedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { close(b.closed) })
	return err
}

// Issue 18, item 9: a loser whose response arrives after the winner's is
// drained, not cut off by the end of the call, so its connection goes back
// to the pool: 20 hedged calls of two attempts each open two connections.
// Each call's first arrival waits until the call has returned (and its
// winner's body was read and closed); the test then waits until the loser's
// body is closed before the next call, so that both connections are idle.
func TestHedgeLoserDrainedKeepsConnection(t *testing.T) {
	const calls = 20
	gates := make([]chan struct{}, calls)
	for i := range gates {
		gates[i] = make(chan struct{})
	}
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n%2 == 1 { // the call's first arrival: the loser
			select {
			case <-gates[(n-1)/2]:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, "late")
			return
		}
		_, _ = io.WriteString(w, "fast")
	})
	base := &bodies{base: &http.Transport{}}
	defer base.base.(*http.Transport).CloseIdleConnections()
	tr, err := NewTransport(base, Options{
		Hedging: HedgingOptions{Enabled: true, MaxHedges: 1, Delay: 2 * time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
	})
	require.NoError(t, err)

	for i := range calls {
		resp, err := hedgeGet(t, tr, http.MethodGet, up.URL(), nil)
		require.NoError(t, err)
		assert.Equal(t, "fast", readBody(t, resp))
		close(gates[i])
		// Both attempts have returned, and every body is closed (a drained
		// one after its connection went back to the pool).
		require.Eventually(t, func() bool {
			return base.returned.Load() == int64(2*(i+1)) && base.closed.Load() == base.opened.Load()
		}, 5*time.Second, time.Millisecond)
	}
	assert.EqualValues(t, 2*calls, up.requests.Load())
	assert.EqualValues(t, 2*calls, base.opened.Load(), "every loser got its response")
	assert.LessOrEqual(t, up.newConns.Load(), int64(2), "one connection per concurrent attempt")
}
