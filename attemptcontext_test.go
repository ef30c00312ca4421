package resilience

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attemptSpy is a base RoundTripper that records what AttemptFromContext
// says of each attempt it sends, from a context made under the attempt's.
type attemptSpy struct {
	base *http.Transport
	mu   sync.Mutex
	seen []Event
}

type spyKey struct{}

func (s *attemptSpy) RoundTrip(r *http.Request) (*http.Response, error) {
	e, ok := AttemptFromContext(context.WithValue(r.Context(), spyKey{}, 1))
	if ok {
		s.mu.Lock()
		s.seen = append(s.seen, e)
		s.mu.Unlock()
	}
	return s.base.RoundTrip(r)
}

func (s *attemptSpy) events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.seen...)
}

// The base sees each attempt of a retried call with its number and the
// wait before it, and the caller's context, not the attempt's.
func TestAttemptFromContextRetries(t *testing.T) {
	up := newTestUpstream(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	spy := &attemptSpy{base: &http.Transport{}}
	defer spy.base.CloseIdleConnections()
	var attempts []Event
	h, err := NewHandler(Options{
		Name:  "spied",
		Retry: RetryOptions{Delay: time.Millisecond, NoJitter: true, Backoff: BackoffConstant, IgnoreRetryAfter: true},
		OnEvent: func(e Event) {
			if e.Kind == EventAttempt {
				attempts = append(attempts, e)
			}
		},
	})
	require.NoError(t, err)

	ctx := context.WithValue(context.Background(), spyKey{}, "caller")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL()+"/p", nil)
	require.NoError(t, err)
	resp, err := h.Transport(spy).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()

	seen := spy.events()
	require.Len(t, seen, 3)
	require.Len(t, attempts, 3)
	for i, e := range seen {
		assert.Equal(t, EventAttempt, e.Kind)
		assert.Equal(t, "spied", e.Handler)
		assert.Equal(t, http.MethodGet, e.Method)
		assert.Equal(t, i+1, e.Attempt)
		assert.Equal(t, attempts[i].Delay, e.Delay, "the delay EventAttempt reports")
		assert.Equal(t, "caller", e.Context.Value(spyKey{}), "the caller's context")
		assert.Equal(t, up.URL()+"/p", e.URL())
		assert.Zero(t, e.Duration)
		assert.Zero(t, e.StatusCode)
		assert.NoError(t, e.Err)
	}
	assert.Equal(t, time.Duration(0), seen[0].Delay)
	assert.Equal(t, time.Millisecond, seen[1].Delay)

	_, ok := AttemptFromContext(ctx)
	assert.False(t, ok, "the caller's context is no attempt's")
	_, ok = AttemptFromContext(context.Background())
	assert.False(t, ok)
}

// Hedged attempts, sent concurrently, each see their own number, and a
// routed attempt its endpoint, as EventAttempt names it.
func TestAttemptFromContextHedgedEndpoints(t *testing.T) {
	first := make(chan struct{})
	var primary *testUpstream
	primary = newTestUpstream(t, func(_ http.ResponseWriter, r *http.Request, _ int) {
		close(first)
		primary.hang(r) // the loser: cancelled once the hedge won
	})
	secondary := newTestUpstream(t, func(http.ResponseWriter, *http.Request, int) {
		<-first // sent only after the first attempt arrived
	})
	spy := &attemptSpy{base: &http.Transport{}}
	defer spy.base.CloseIdleConnections()
	var mu sync.Mutex
	var attempts []Event
	ended := make(chan struct{}) // both attempts reported, the loser's after the call
	h, err := NewHandler(Options{
		Name:    "spied",
		PerHost: PerHostOptions{Enabled: true},
		Hedging: HedgingOptions{
			Enabled: true, MaxHedges: 1, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap,
		},
		Endpoints: []Endpoint{{URL: primary.URL()}, {URL: secondary.URL()}},
		OnEvent: func(e Event) {
			if e.Kind == EventAttempt {
				mu.Lock()
				if attempts = append(attempts, e); len(attempts) == 2 {
					close(ended)
				}
				mu.Unlock()
			}
		},
	})
	require.NoError(t, err)

	req, err := http.NewRequest(http.MethodGet, "http://spied.invalid/", nil)
	require.NoError(t, err)
	resp, err := h.Transport(spy).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()

	seen := spy.events()
	require.Len(t, seen, 2)
	byAttempt := map[int]Event{}
	for _, e := range seen {
		byAttempt[e.Attempt] = e
	}
	assert.Equal(t, primary.URL(), byAttempt[1].Endpoint)
	assert.Equal(t, primary.URL(), byAttempt[1].Host)
	assert.Equal(t, secondary.URL(), byAttempt[2].Endpoint)
	assert.Equal(t, secondary.URL(), byAttempt[2].Host)
	assert.Equal(t, time.Millisecond, byAttempt[2].Delay, "the hedge went Delay after the first")

	<-ended
	mu.Lock()
	defer mu.Unlock()
	for _, a := range attempts {
		assert.Equal(t, a.Endpoint, byAttempt[a.Attempt].Endpoint, "as EventAttempt names it")
		assert.Equal(t, a.Host, byAttempt[a.Attempt].Host)
		assert.Equal(t, a.Delay, byAttempt[a.Attempt].Delay)
	}
}

// A handler without observers does not describe its attempts: their
// requests cost it nothing for AttemptFromContext.
func TestAttemptFromContextNeedsObservers(t *testing.T) {
	up := newTestUpstream(t, func(http.ResponseWriter, *http.Request, int) {})
	spy := &attemptSpy{base: &http.Transport{}}
	defer spy.base.CloseIdleConnections()
	h, err := NewHandler(Options{})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, up.URL(), nil)
	require.NoError(t, err)
	resp, err := h.Transport(spy).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, spy.events())
}
