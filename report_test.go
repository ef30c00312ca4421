package resilience

import (
	"context"
	"io"
	"math/rand/v2"
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
