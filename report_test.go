package resilience

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 18, item 15: a wait the caller cut short counts for the time it
// lasted, not for the delay it was planned to be.
func TestReportWaitedCountsTheWaitMade(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	retrying := make(chan struct{}, 1)
	opts := Options{OnEvent: func(e Event) {
		if e.Kind == EventRetry {
			retrying <- struct{}{}
		}
	}}
	tr, err := NewTransport(&http.Transport{}, opts)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	var r Report
	ctx, cancel := context.WithCancel(WithReport(context.Background(), &r))
	go func() {
		<-retrying // the 2 s wait begins
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	_, err = tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, up.URL(), nil))
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 1, r.Attempts)
	assert.GreaterOrEqual(t, r.Waited, 100*time.Millisecond)
	assert.Less(t, r.Waited, time.Second, "the caller left 100 ms into the 2 s wait")
}

// Issue 18, item 16: a Report covers the whole exchange made with its
// context, every hop of the redirects http.Client follows: the counts add
// up over the hops, and Endpoint names the one whose answer the caller got.
func TestReportCoversEveryHopOfARedirect(t *testing.T) {
	b := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		_, _ = io.WriteString(w, "from b")
	})
	a := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		http.Redirect(w, r, b.URL()+"/there", http.StatusFound)
	})
	tr, err := NewTransport(&http.Transport{}, Options{Retry: RetryOptions{Delay: time.Millisecond, MaxDelay: time.Millisecond, NoJitter: true}})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var r Report
	resp, err := client.Do(newTestRequest(t, WithReport(context.Background(), &r), http.MethodGet, a.URL()+"/here", nil))
	require.NoError(t, err)
	assert.Equal(t, "from b", readBody(t, resp))
	assert.Equal(t, 3, r.Attempts, "503 and 302 from a, then 200 from b")
	assert.GreaterOrEqual(t, r.Waited, time.Millisecond, "the one wait, on a")
	assert.Equal(t, b.URL(), r.Endpoint, "the endpoint of the answer the caller got")
}

// quickBase answers every attempt with a 200 after 0.5 to 2 ms, or with
// its context's error if that ends first.
type quickBase struct{}

func (quickBase) RoundTrip(r *http.Request) (*http.Response, error) {
	t := time.NewTimer(time.Duration(500+rand.IntN(1500)) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), ContentLength: 2, Request: r}, nil
}

// Issue 29, item 8: the caller's Report is written by the call's own
// goroutine only, before RoundTrip returns. Hedges over an overload limit
// of 1 are shed in their goroutines while the call's goroutine fills in
// the Report and returns: before, the hedge's goroutine wrote Report.Shed
// itself, at any time, and the race detector caught it in most runs.
func TestReportHedgesShedRaceNothing(t *testing.T) {
	h, err := NewHandler(Options{
		Hedging:        HedgingOptions{Enabled: true, MaxHedges: 3, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
		Overload:       OverloadOptions{MinLimit: 1, MaxLimit: 1, InitialLimit: 1, MaxQueueWait: 2 * time.Second},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
	})
	require.NoError(t, err)
	tr := h.Transport(quickBase{})
	const workers, perWorker = 12, 40
	var shed, calls atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				var r Report
				resp, err := tr.RoundTrip(newTestRequest(t, WithReport(context.Background(), &r), http.MethodGet, "http://upstream.test/", nil))
				if !assert.NoError(t, err) {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				calls.Add(1)
				if r.Shed {
					shed.Add(1)
				}
				assert.GreaterOrEqual(t, r.Attempts, 1)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, workers*perWorker, calls.Load())
	assert.Positive(t, shed.Load(), "hedges were shed at the limit of 1, and Reports say so")
}

// closeSignal is a body that closes done when it is closed.
type closeSignal struct {
	io.ReadCloser
	once sync.Once
	done chan struct{}
}

func (b *closeSignal) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { close(b.done) })
	return err
}

// loserSpy is a base whose first attempt (by AttemptFromContext) waits
// for release before it is sent, and whose response body says, when
// closed, that the handler has done with that attempt.
type loserSpy struct {
	base    http.RoundTripper
	release chan struct{}
	first   *closeSignal
}

func (s *loserSpy) RoundTrip(r *http.Request) (*http.Response, error) {
	a, _ := AttemptFromContext(r.Context())
	if a.Attempt != 1 {
		return s.base.RoundTrip(r)
	}
	<-s.release // until the call returned, however it is cancelled meanwhile
	resp, err := s.base.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
	if err == nil {
		s.first.ReadCloser = resp.Body
		resp.Body = s.first
	}
	return resp, err
}

// Issue 29, item 8: a hedge that finishes after its call returned emits
// nothing of that call's: every event about the call was emitted before
// RoundTrip returned. The first attempt is slow and loses to a hedge; it
// answers only after the call returned, and is drained then. Before, its
// goroutine emitted its EventAttempt at that point, after the caller had
// its answer.
func TestHedgeOutlivingItsCallEmitsNothing(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		_, _ = io.WriteString(w, "answer")
	})
	var returned atomic.Bool
	var mu sync.Mutex
	var events, late []Event
	spy := &loserSpy{base: &http.Transport{}, release: make(chan struct{}), first: &closeSignal{done: make(chan struct{})}}
	h, err := NewHandler(Options{
		Hedging: HedgingOptions{Enabled: true, MaxHedges: 1, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
		OnEvent: func(e Event) {
			mu.Lock()
			defer mu.Unlock()
			if e.Context != nil && returned.Load() {
				late = append(late, e)
			}
			events = append(events, e)
		},
	})
	require.NoError(t, err)
	tr := h.Transport(spy)
	defer spy.base.(*http.Transport).CloseIdleConnections()

	resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, up.URL(), nil))
	returned.Store(true)
	require.NoError(t, err)
	assert.Equal(t, "answer", readBody(t, resp))
	close(spy.release) // the loser is sent now, and answers, after the call returned
	select {
	case <-spy.first.done: // drained and closed: its goroutine is over
	case <-time.After(5 * time.Second):
		t.Fatal("the loser was never drained")
	}

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, late, "events of the call emitted after RoundTrip returned")
	var attempts []int
	for _, e := range events {
		if e.Kind == EventAttempt {
			attempts = append(attempts, e.Attempt)
			if e.Attempt == 1 {
				assert.ErrorIs(t, e.Err, context.Canceled, "the loser, reported as the call returned: canceled, as metrics class it")
				assert.ErrorContains(t, e.Err, "another hedged attempt won")
				assert.Zero(t, e.StatusCode, "its answer came after the call returned")
			}
		}
	}
	assert.ElementsMatch(t, []int{1, 2}, attempts, "each attempt sent is reported once, the loser too")
}

// Issue 29, item 8: a hedged call that ends while its first attempt still
// waits for an overload slot never sends it, and neither counts nor
// reports it: Report.Attempts is the attempts sent, as for a call without
// hedging. (Its goroutine cannot write the Report; the call's loop, as it
// ends, takes the attempt back before it is sent.)
func TestHedgedCallEndingWhileItsFirstAttemptQueues(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/hold" {
			<-r.Context().Done()
		}
	})
	rec := &evRecorder{measures: true}
	shedHedge := make(chan struct{}, 1)
	h, err := NewHandler(Options{
		Hedging:        HedgingOptions{Enabled: true, MaxHedges: 1, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
		Overload:       OverloadOptions{MinLimit: 1, MaxLimit: 1, InitialLimit: 1, MaxQueueWait: time.Minute},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent: func(e Event) {
			rec.add(e)
			if e.Kind == EventOverloadShed && e.URL() == up.URL()+"/queued" {
				select {
				case shedHedge <- struct{}{}:
				default:
				}
			}
		},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	holdCtx, release := context.WithCancel(context.Background())
	held := make(chan struct{})
	go func() {
		defer close(held)
		_, err := tr.RoundTrip(newTestRequest(t, holdCtx, http.MethodGet, up.URL()+"/hold", nil))
		assert.ErrorIs(t, err, context.Canceled)
	}()
	require.Eventually(t, func() bool { return up.requests.Load() == 1 }, 5*time.Second, time.Millisecond, "the slot is taken")

	var r Report
	ctx, cancel := context.WithCancel(WithReport(context.Background(), &r))
	go func() {
		<-shedHedge // the first attempt queues, and the hedge was shed
		cancel()
	}()
	_, err = tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, up.URL()+"/queued", nil))
	require.ErrorIs(t, err, context.Canceled)
	release()
	<-held

	assert.Zero(t, r.Attempts, "nothing was sent")
	assert.True(t, r.Shed)
	for _, e := range rec.of(EventAttempt) {
		assert.NotEqual(t, up.URL()+"/queued", e.URL(), "no attempt of the queued call was sent: %+v", e)
	}
	assert.EqualValues(t, 1, up.requests.Load())
}

// Issue 29, item 7: Report.Outcome says why a call ended, without the
// error: a rate-limited call, an attempt timeout, the upstream's 503 after
// retries, the caller's own cancellation... are told apart, and where the
// error RoundTrip returns names the same failure (ErrorType), both say it
// in the same words.
func TestReportOutcome(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() }
	status := func(code int) func(w http.ResponseWriter, r *http.Request, n int) {
		return func(w http.ResponseWriter, r *http.Request, n int) { http.Error(w, "answer", code) }
	}
	noRetry := RetryOptions{Disabled: true}
	opensOnOneFailure := CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 1, BreakDuration: time.Hour}
	cases := []struct {
		name     string
		opts     Options
		upstream func(w http.ResponseWriter, r *http.Request, n int)
		// call makes the call to url through tr with ctx, the Report's,
		// after any set-up it needs; nil makes one GET
		call    func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error)
		want    Outcome
		status  int
		flagged func(Report) bool // the Report's flag that says why no retry followed, if one does
	}{
		{name: "success", upstream: status(http.StatusOK), want: OutcomeSuccess, status: http.StatusOK},
		{name: "a 404 is an answer", upstream: status(http.StatusNotFound), want: OutcomeSuccess, status: http.StatusNotFound},
		{name: "retries ran out on a 503", opts: Options{Retry: RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true}},
			upstream: status(http.StatusServiceUnavailable), want: OutcomeFailureStatus, status: http.StatusServiceUnavailable},
		{name: "a POST's 503 is not retried", upstream: status(http.StatusServiceUnavailable),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodPost, url, strings.NewReader("x")))
			},
			want: OutcomeFailureStatus, status: http.StatusServiceUnavailable},
		{name: "the circuit refused the retry of a 503", opts: Options{Retry: quickRetry(), CircuitBreaker: opensOnOneFailure},
			upstream: status(http.StatusServiceUnavailable), want: OutcomeFailureStatus, status: http.StatusServiceUnavailable,
			flagged: func(r Report) bool { return r.CircuitRejected }},
		{name: "the budget refused the retry of a 503",
			opts:     Options{Retry: RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true}, RetryBudget: RetryBudgetOptions{MaxTokens: 1}},
			upstream: status(http.StatusServiceUnavailable),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, url, nil)) // spends the token
				require.NoError(t, err)
				readBody(t, resp)
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeFailureStatus, status: http.StatusServiceUnavailable, flagged: func(r Report) bool { return r.BudgetRefused }},
		{name: "hedging: success", opts: Options{Hedging: HedgingOptions{Enabled: true, Delay: time.Hour}},
			upstream: status(http.StatusOK), want: OutcomeSuccess, status: http.StatusOK},
		{name: "hedging: every attempt failed", opts: Options{Hedging: HedgingOptions{Enabled: true, MaxHedges: 1, Delay: time.Hour}},
			upstream: status(http.StatusBadGateway), want: OutcomeFailureStatus, status: http.StatusBadGateway},
		{name: "attempt timeout", opts: Options{AttemptTimeout: 20 * time.Millisecond, StrictAttemptTimeout: true, Retry: noRetry},
			upstream: hang, want: OutcomeAttemptTimeout},
		{name: "total timeout", opts: Options{TotalTimeout: 50 * time.Millisecond, AttemptTimeout: -1},
			upstream: hang, want: OutcomeTotalTimeout},
		{name: "the total timeout cuts the body: the call had ended on its response",
			opts: Options{TotalTimeout: 50 * time.Millisecond, AttemptTimeout: -1},
			upstream: func(w http.ResponseWriter, r *http.Request, n int) {
				_, _ = io.WriteString(w, "start")
				http.NewResponseController(w).Flush()
				<-r.Context().Done()
			},
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				resp, err := tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
				require.NoError(t, err)
				_, err = io.ReadAll(resp.Body)
				require.ErrorIs(t, err, ErrTotalTimeout)
				return resp, nil
			},
			want: OutcomeSuccess, status: http.StatusOK},
		{name: "circuit open", upstream: status(http.StatusOK),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				tr.Handler().IsolateCircuit()
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeCircuitOpen},
		{name: "overloaded", opts: Options{Overload: OverloadOptions{MinLimit: 1, MaxLimit: 1, InitialLimit: 1, MaxQueueWait: time.Millisecond}},
			upstream: func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					<-r.Context().Done()
				}
			},
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				holdCtx, release := context.WithCancel(context.Background())
				held := make(chan struct{})
				go func() {
					defer close(held)
					_, _ = tr.RoundTrip(newTestRequest(t, holdCtx, http.MethodGet, url, nil))
				}()
				defer func() { release(); <-held }()
				require.Eventually(t, func() bool { return tr.Handler().OverloadStats()[""].InFlight == 1 }, 5*time.Second, time.Millisecond)
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeOverloaded},
		{name: "rate limited", opts: Options{RateLimit: RateLimitOptions{RequestsPerSecond: 0.001, Burst: 1}}, upstream: status(http.StatusOK),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				resp, err := tr.RoundTrip(newTestRequest(t, context.Background(), http.MethodGet, url, nil)) // the one permit
				require.NoError(t, err)
				readBody(t, resp)
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeRateLimited},
		{name: "canceled by the caller", upstream: hang,
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				ctx, cancel := context.WithCancel(ctx)
				go func() {
					time.Sleep(20 * time.Millisecond)
					cancel()
				}()
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeCanceled},
		{name: "the caller's deadline", opts: Options{TotalTimeout: -1, AttemptTimeout: -1}, upstream: hang,
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				ctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
				defer cancel()
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeDeadlineExceeded},
		{name: "the request's own body failed", upstream: status(http.StatusOK),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodPost, url, &failingReader{data: "partial", err: errors.New("disk on fire")}))
			},
			want: OutcomeRequestFault},
		{name: "connection refused", opts: Options{Retry: noRetry}, upstream: status(http.StatusOK),
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				addr := l.Addr().String()
				l.Close()
				return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, "http://"+addr+"/", nil))
			},
			want: OutcomeTransportError},
		{name: "redirected: the last hop's", opts: Options{Retry: RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true}},
			upstream: func(w http.ResponseWriter, r *http.Request, n int) {
				if r.URL.Path == "/" {
					http.Redirect(w, r, "/there", http.StatusFound)
					return
				}
				http.Error(w, "answer", http.StatusServiceUnavailable)
			},
			call: func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
				return (&http.Client{Transport: tr}).Do(newTestRequest(t, ctx, http.MethodGet, url, nil))
			},
			want: OutcomeFailureStatus, status: http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newTestUpstream(t, tc.upstream)
			tr, err := NewTransport(&http.Transport{}, tc.opts)
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			call := tc.call
			if call == nil {
				call = func(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
					return tr.RoundTrip(newTestRequest(t, ctx, http.MethodGet, url, nil))
				}
			}
			var r Report
			resp, err := call(t, tr, WithReport(context.Background(), &r), up.URL()+"/")
			if resp != nil {
				resp.Body.Close()
			}
			assert.Equal(t, tc.want, r.Outcome, "%s; err: %v", r.Outcome, err)
			assert.Equal(t, tc.status, r.StatusCode)
			if tc.status != 0 {
				require.NoError(t, err)
				assert.Equal(t, tc.status, resp.StatusCode)
			} else {
				require.Error(t, err)
				var et interface{ ErrorType() string }
				if errors.As(err, &et) && tc.want != OutcomeRequestFault && tc.want != OutcomeTransportError {
					assert.Equal(t, et.ErrorType(), r.Outcome.String(), "the error and the Report name it alike")
				}
			}
			if tc.flagged != nil {
				assert.True(t, tc.flagged(r), "%+v", r)
			}
		})
	}
}

// Outcome names itself, as a string and as JSON text.
func TestOutcomeString(t *testing.T) {
	for o := OutcomeNone; o <= OutcomeTransportError; o++ {
		assert.NotEqual(t, "unknown", o.String(), int(o))
		b, err := o.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, o.String(), string(b))
	}
	assert.Equal(t, "unknown", Outcome(-1).String())
	_, err := Outcome(99).MarshalText()
	assert.ErrorContains(t, err, "unknown outcome 99")
	b, err := json.Marshal(Report{Outcome: OutcomeRateLimited})
	require.NoError(t, err)
	assert.Contains(t, string(b), `"Outcome":"rate_limited"`)
}
