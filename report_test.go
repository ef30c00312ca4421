package resilience

import (
	"context"
	"io"
	"net/http"
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
