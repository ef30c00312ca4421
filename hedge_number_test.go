package resilience

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/server"
)

// Issue 47, item 14: a hedge shed before it is sent takes no number. The
// numbers of the attempts sent (in their events, AttemptFromContext and the
// propagated attempt header) run from 1 without a gap, and the last is
// Report.Attempts.
func TestHedgeNumbersCountWhatWasSent(t *testing.T) {
	names := server.DefaultHeaders()
	var mu sync.Mutex
	var stamped []int // the attempt header each endpoint got
	stamp := func(r *http.Request) {
		n, err := strconv.Atoi(r.Header.Get(names.Attempt))
		assert.NoError(t, err)
		mu.Lock()
		stamped = append(stamped, n)
		mu.Unlock()
	}
	release := make(chan struct{})
	a := newReplica(t, func(w http.ResponseWriter, r *http.Request) { // the first attempt, overtaken
		stamp(r)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	b := newReplica(t, func(w http.ResponseWriter, r *http.Request) { // never reached: its only slot is taken
		stamp(r)
	})
	c := newReplica(t, func(w http.ResponseWriter, r *http.Request) { // the third hedge, sent as the second attempt
		stamp(r)
		_, _ = io.WriteString(w, "c")
	})
	defer close(release)

	rec := &evRecorder{measures: true}
	h, err := NewHandler(Options{
		Hedging:     HedgingOptions{Enabled: true, MaxHedges: 2, Delay: time.Millisecond, MaxExtraLoad: NoExtraLoadCap},
		Overload:    OverloadOptions{MinLimit: 1, MaxLimit: 1, InitialLimit: 1, MaxQueue: 10, MaxQueueWait: time.Minute},
		Propagation: PropagationOptions{Enabled: true},
		Endpoints:   endpointsOf(a, b, c),
		OnEvent:     rec.add,
	})
	require.NoError(t, err)
	holdSlot(t, h, b.URL)
	spy := &attemptSpy{base: &http.Transport{}}
	defer spy.base.CloseIdleConnections()

	report, resp, err := failoverGet(t, h.Transport(spy), http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, "c", readBody(t, resp))
	assert.Zero(t, b.hits.Load())

	shed := rec.of(EventOverloadShed)
	require.Len(t, shed, 1, "the hedge to B")
	assert.Equal(t, b.URL, shed[0].Host)
	assert.Equal(t, 2, shed[0].Attempt, "the number the next attempt sent takes")

	byNumber := map[int]string{}
	for _, e := range rec.of(EventAttempt) {
		byNumber[e.Attempt] = e.Endpoint
	}
	assert.Equal(t, map[int]string{1: a.URL, 2: c.URL}, byNumber, "EventAttempt")
	var fromContext []int
	for _, e := range spy.events() {
		fromContext = append(fromContext, e.Attempt)
	}
	assert.Equal(t, []int{1, 2}, fromContext, "AttemptFromContext")
	mu.Lock()
	got := slices.Clone(stamped)
	mu.Unlock()
	assert.Equal(t, []int{1, 2}, got, "the attempt header")
	assert.Equal(t, 2, report.Attempts)
	calls := rec.of(EventCall)
	require.Len(t, calls, 1)
	assert.Equal(t, 2, calls[0].Attempt)
}
