package resilience

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/internal/overload"
)

// newHeldUpstream is an upstream that holds every request until release is
// closed or the request's context ends.
func newHeldUpstream(t *testing.T) (*testUpstream, chan struct{}) {
	release := make(chan struct{})
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	return u, release
}

// overloadTestOptions limit the attempts in flight to limit, and never more.
func overloadTestOptions(limit int) Options {
	return Options{
		Name:     "ovl",
		Retry:    quickRetry(),
		Overload: OverloadOptions{MinLimit: limit, MaxLimit: limit, InitialLimit: limit, MaxQueue: 10, MaxQueueWait: time.Minute},
	}
}

// A burst over the limit waits in the queue and is served, not failed.
func TestOverloadQueuesABurst(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 10)
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		<-release
	})
	c := newTestClient(t, overloadTestOptions(2))
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for range 5 {
		wg.Go(func() {
			resp, err := c.getBounded(t, u.URL())
			if err == nil {
				readBody(t, resp)
			}
			errs <- err
		})
	}
	<-arrived
	<-arrived
	h := c.tr.Handler()
	require.Eventually(t, func() bool { return h.shared.policies.Load().overload.Stats().Queued == 3 }, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, 2, u.requests.Load(), "two in flight, the rest queued")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, 5, u.requests.Load())
	assert.Empty(t, c.events.ofKind(EventOverloadShed))
}

// A slot is held until the response headers arrive, not while the caller
// reads the body.
func TestOverloadSlotEndsAtHeaders(t *testing.T) {
	release := make(chan struct{})
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if n == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	c := newTestClient(t, overloadTestOptions(1))
	slow, err := c.getBounded(t, u.URL())
	require.NoError(t, err)
	defer slow.Body.Close()
	resp, err := c.getBounded(t, u.URL()) // the first call's body is still unread
	require.NoError(t, err)
	readBody(t, resp)
	close(release)
}

// Over the limit with the queue full, or past the wait, a call fails at
// once with ErrOverloaded, naming the handler and the limit; never after
// its deadline.
func TestOverloadRefusesWhenItCannotWait(t *testing.T) {
	u, release := newHeldUpstream(t)
	defer close(release)
	o := overloadTestOptions(1)
	o.Overload.MaxQueueWait = time.Millisecond
	c := newTestClient(t, o)
	go func() {
		if resp, err := c.getBounded(t, u.URL()); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return u.requests.Load() == 1 }, 5*time.Second, time.Millisecond)

	_, err := c.getBounded(t, u.URL())
	require.ErrorIs(t, err, ErrOverloaded)
	var oe *OverloadError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 1, oe.Limit)
	assert.Equal(t, 1, oe.InFlight)
	assert.Contains(t, err.Error(), `resilience: handler "ovl": upstream overloaded`)
	assert.False(t, IsTransient(nil, err), "a refusal is not retried")
	assert.Len(t, c.events.ofKind(EventOverloadShed), 1)
	assert.Len(t, c.events.ofKind(EventOverloaded), 1, "one event per change of state")
	assert.Empty(t, c.events.ofKind(EventCircuitRejected))

	// The caller's deadline bounds the wait, whatever MaxQueueWait says.
	o = overloadTestOptions(1)
	c2 := newTestClient(t, o)
	_, err = c2.tr.Handler().shared.policies.Load().overload.Acquire(context.Background(), 0, time.Time{}, overload.First, time.Now()) // the only slot, taken
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c2.Do(newTestRequest(t, ctx, http.MethodGet, u.URL(), nil))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrOverloaded) || errors.Is(err, context.DeadlineExceeded), err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.EqualValues(t, 1, u.requests.Load(), "nothing sent")
}

// A retry finds the limit full while the limiter is shedding (it has just
// refused a first attempt): it is not sent, and the call returns the
// outcome before it, as when the retry budget refuses; nothing counts
// against the budget or the breaker.
func TestOverloadShedsRetriesFirst(t *testing.T) {
	release := make(chan struct{})
	bIn := make(chan struct{})
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/b" {
			close(bIn)
			<-release
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	o := overloadTestOptions(1)
	o.Overload.MaxQueueWait = 10 * time.Millisecond
	var c *testClient
	bDone := make(chan struct{})
	o.Retry.DelayFunc = func(DelayInfo) time.Duration {
		go func() { // another call takes the only slot while this one waits to retry
			defer close(bDone)
			if resp, err := c.getBounded(t, u.URL()+"/b"); err == nil {
				resp.Body.Close()
			}
		}()
		<-bIn
		// a third call's first attempt waits its MaxQueueWait and is
		// refused: the limiter is shedding
		_, err := c.getBounded(t, u.URL()+"/c")
		assert.ErrorIs(t, err, ErrOverloaded)
		return 0
	}
	c = newTestClient(t, o)
	var rep Report
	ctx := WithReport(context.Background(), &rep)
	resp, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL()+"/a", nil))
	require.NoError(t, err, "retries ran out on a response: the response")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	readBody(t, resp)
	assert.Equal(t, 1, rep.Attempts)
	assert.True(t, rep.Shed)
	assert.False(t, rep.BudgetRefused)
	shed := c.events.ofKind(EventOverloadShed)
	require.Len(t, shed, 2)
	assert.Equal(t, 1, shed[0].Attempt, "the third call's")
	assert.Equal(t, 2, shed[1].Attempt, "the retry, shed at once")
	assert.Less(t, shed[1].Err.(*OverloadError).Waited, time.Millisecond)
	assert.Equal(t, CircuitClosed, c.tr.Handler().CircuitState())
	close(release)
	<-bDone
}

// A hedge finds the limit full: it is not sent; the first attempt wins.
func TestOverloadShedsHedges(t *testing.T) {
	u, release := newHeldUpstream(t)
	o := overloadTestOptions(1)
	o.Hedging = HedgingOptions{Enabled: true, Delay: time.Millisecond, MaxHedges: 1}
	c := newTestClient(t, o)
	done := make(chan error, 1)
	go func() {
		resp, err := c.getBounded(t, u.URL())
		if err == nil {
			readBody(t, resp)
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return len(c.events.ofKind(EventOverloadShed)) == 1 }, 5*time.Second, time.Millisecond)
	close(release)
	require.NoError(t, <-done)
	assert.EqualValues(t, 1, u.requests.Load(), "the hedge was not sent")
}

// The limiter's state shows in the health report and in OverloadStats, and
// a logger gets one record per change of state, not one per refusal.
func TestOverloadVisible(t *testing.T) {
	u, release := newHeldUpstream(t)
	defer close(release)
	var logs bytes.Buffer
	o := overloadTestOptions(1)
	o.Overload.MaxQueueWait = time.Millisecond
	o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := newTestClient(t, o)
	h := c.tr.Handler()
	assert.Equal(t, "healthy", CheckHealth(h).Status)
	go func() {
		if resp, err := c.getBounded(t, u.URL()); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return u.requests.Load() == 1 }, 5*time.Second, time.Millisecond)
	for range 3 {
		_, err := c.getBounded(t, u.URL())
		require.ErrorIs(t, err, ErrOverloaded)
	}
	st := h.OverloadStats()[""]
	assert.Equal(t, OverloadStats{Limit: 1, InFlight: 1, Refused: 3, Overloaded: true}, st)
	report := CheckHealth(h)
	assert.Equal(t, "degraded", report.Status)
	assert.Equal(t, &st, report.Handlers["ovl"].Overload, "the handler's own, without PerHost")
	assert.Equal(t, 1, strings.Count(logs.String(), "\n"), logs.String())

	on := newTestClient(t, Options{})
	assert.Equal(t, map[string]OverloadStats{"": {Limit: defaultOverloadInitialLimit}}, on.tr.Handler().OverloadStats(), "on by default")
	off := newTestClient(t, Options{Overload: OverloadOptions{Disabled: true}})
	assert.Nil(t, off.tr.Handler().OverloadStats())
	assert.Nil(t, CheckHealth(off.tr.Handler()).Handlers["standard"].Overload)
}

// Random failures are not overload: 32 callers against an upstream that
// fails the first attempt of every fourth call (a fifth of all attempts are
// 503s) get every retry they need, and nothing is shed. Before the loss cap
// tolerated random loss, each 503 cut it towards MinLimit and the retries
// over it were shed. Each answer takes 30 ms: against a loopback answer of
// 5 ms, a loaded machine's few milliseconds of delay read as an upstream
// three times slower than usual, and the sluggish test shed retries (2 of
// 1,000 in a CI run: "its last answers took 15.7ms against a usual 4.9ms").
func TestOverloadLeavesRandomFailuresToRetries(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		first := !seen[r.URL.Path]
		seen[r.URL.Path] = true
		mu.Unlock()
		var i int
		_, _ = fmt.Sscanf(r.URL.Path, "/%d", &i)
		time.Sleep(30 * time.Millisecond)
		if first && i%4 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	c := newTestClient(t, Options{Name: "ovl", Retry: quickRetry()}) // the limiter as it ships
	const callers, calls = 32, 25
	var wg sync.WaitGroup
	var ok atomic.Int64
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range calls {
				resp, err := c.getBounded(t, fmt.Sprintf("%s/%d", u.URL(), w*calls+k))
				if err == nil && resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
				if err == nil {
					readBody(t, resp)
				}
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, callers*calls, ok.Load(), "every call served, on its retry if it needed one")
	assert.Empty(t, c.events.ofKind(EventOverloadShed))
	assert.EqualValues(t, callers*calls*5/4, u.requests.Load())
}

// A hedged call whose first attempt cannot get a slot within MaxQueueWait
// fails with ErrOverloaded, and no hedge is sent in its place.
func TestOverloadRefusesAHedgedCall(t *testing.T) {
	u, release := newHeldUpstream(t)
	defer close(release)
	o := overloadTestOptions(1)
	o.Overload.MaxQueueWait = 20 * time.Millisecond
	o.Hedging = HedgingOptions{Enabled: true, Delay: time.Millisecond, MaxHedges: 2}
	c := newTestClient(t, o)
	go func() {
		if resp, err := c.getBounded(t, u.URL()); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return u.requests.Load() == 1 }, 5*time.Second, time.Millisecond)

	var rep Report
	ctx, cancel := context.WithTimeout(WithReport(context.Background(), &rep), 10*time.Second)
	defer cancel()
	_, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL(), nil))
	require.ErrorIs(t, err, ErrOverloaded)
	var oe *OverloadError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 1, oe.Limit)
	assert.GreaterOrEqual(t, oe.Waited, 20*time.Millisecond, "it waited its MaxQueueWait")
	assert.EqualValues(t, 1, u.requests.Load(), "neither the refused attempt nor a hedge was sent")
	assert.Zero(t, rep.Attempts)
	assert.Equal(t, CircuitClosed, c.tr.Handler().CircuitState(), "a refusal is not the upstream's failure")
}

// A live Update of Overload takes effect for the next attempt: a new
// limiter with the new limits, the attempts in flight giving their slots
// back to the old one; Disabled removes it, and switching it on again
// starts afresh.
func TestOverloadUpdate(t *testing.T) {
	release := make(chan struct{})
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/hold" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	o := overloadTestOptions(1)
	o.Overload.MaxQueueWait = time.Millisecond
	c := newTestClient(t, o)
	h := c.tr.Handler()
	held := make(chan error, 1)
	go func() {
		resp, err := c.getBounded(t, u.URL()+"/hold")
		if err == nil {
			readBody(t, resp)
		}
		held <- err
	}()
	require.Eventually(t, func() bool { return u.requests.Load() == 1 }, 5*time.Second, time.Millisecond)
	_, err := c.getBounded(t, u.URL())
	require.ErrorIs(t, err, ErrOverloaded, "the one slot is held")
	old := h.shared.policies.Load().overload

	o.Overload.MinLimit, o.Overload.MaxLimit, o.Overload.InitialLimit = 2, 2, 2
	require.NoError(t, h.Update(o))
	resp, err := c.getBounded(t, u.URL())
	require.NoError(t, err, "the new limiter has room")
	readBody(t, resp)
	assert.Equal(t, OverloadStats{Limit: 2, Latency: h.OverloadStats()[""].Latency}, h.OverloadStats()[""])

	close(release)
	require.NoError(t, <-held)
	assert.Zero(t, old.Stats().InFlight, "the held attempt gave its slot back to the old limiter")
	assert.Zero(t, h.OverloadStats()[""].InFlight, "and took none from the new one")

	o.Overload.Disabled = true
	require.NoError(t, h.Update(o))
	assert.Nil(t, h.OverloadStats())
	o.Overload.Disabled = false
	require.NoError(t, h.Update(o))
	assert.Equal(t, OverloadStats{Limit: 2}, h.OverloadStats()[""], "on again: a limiter that learns afresh")

	o.Overload.MinLimit = -1
	assert.ErrorContains(t, h.Update(o), "Overload.MinLimit (-1): must not be negative")
}

// sluggishUpstream answers /fast at once, /slow after 100 ms, the first
// request for /fail with a fast 503 and the next with "ok", and holds the
// first request for /hedged until its caller leaves (at most 5 s, then
// "first"), answering the next "hedge". makeSluggish has the handler of c see it answer
// 20 times fast, then twice 50 times slower: sluggish.
func sluggishUpstream(t *testing.T) (u *testUpstream, makeSluggish func(c *testClient)) {
	var failed, hedgedOnce sync.Once
	u = newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.URL.Path {
		case "/slow":
			time.Sleep(100 * time.Millisecond)
		case "/fail":
			first := false
			failed.Do(func() { first = true })
			if first {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		case "/hedged":
			first := false
			hedgedOnce.Do(func() { first = true })
			if !first {
				_, _ = io.WriteString(w, "hedge")
				return
			}
			select {
			case <-r.Context().Done(): // the hedge won
			case <-time.After(5 * time.Second):
				_, _ = io.WriteString(w, "first")
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	return u, func(c *testClient) {
		for _, p := range append(slices.Repeat([]string{"/fast"}, 20), "/slow", "/slow") {
			resp, err := c.getBounded(t, u.URL()+p)
			require.NoError(t, err)
			readBody(t, resp)
		}
	}
}

// Issue 47: a hedge is sent because the upstream is slow to answer its
// call; the sluggish rule, which sheds retries while the upstream's last
// answers came far slower than usual, shed every hedge too (5 of 5 after
// two slow calls). A hedge sent while the first attempt runs is not a
// retry: it goes, bounded by MaxExtraLoad.
func TestOverloadSendsTheHedgesOfASluggishUpstream(t *testing.T) {
	u, makeSluggish := sluggishUpstream(t)
	c := newTestClient(t, Options{Name: "ovl", Hedging: HedgingOptions{Enabled: true, Delay: 300 * time.Millisecond, MaxHedges: 1, MaxExtraLoad: NoExtraLoadCap}})
	makeSluggish(c)

	var rep Report
	ctx, cancel := context.WithTimeout(WithReport(context.Background(), &rep), 10*time.Second)
	defer cancel()
	resp, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL()+"/hedged", nil))
	require.NoError(t, err)
	assert.Equal(t, "hedge", readBody(t, resp), "the hedge was sent, and won")
	assert.False(t, rep.Shed)
	assert.Equal(t, 2, rep.Attempts)
	assert.Empty(t, c.events.ofKind(EventOverloadShed))
}

// Issue 31: while the upstream's last answers came far slower than usual
// (here 100 ms against a usual fraction of a millisecond, an httptest
// server that sleeps), a retry is shed: the call gets the 503 its first
// attempt had, as a bare client would.
func TestOverloadShedsTheRetriesOfASluggishUpstream(t *testing.T) {
	u, makeSluggish := sluggishUpstream(t)
	c := newTestClient(t, Options{Name: "ovl", Retry: quickRetry()})
	makeSluggish(c)

	var rep Report
	ctx, cancel := context.WithTimeout(WithReport(context.Background(), &rep), 10*time.Second)
	defer cancel()
	resp, err := c.Do(newTestRequest(t, ctx, http.MethodGet, u.URL()+"/fail", nil))
	require.NoError(t, err)
	readBody(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the retry was shed: the first attempt's answer")
	assert.True(t, rep.Shed)
	assert.Equal(t, 1, rep.Attempts)
	shed := c.events.ofKind(EventOverloadShed)
	require.Len(t, shed, 1)
	var oe *OverloadError
	require.ErrorAs(t, shed[0].Err, &oe)
	assert.Greater(t, oe.Latency, 3*oe.Usual, "its last answers, against the usual")
}
