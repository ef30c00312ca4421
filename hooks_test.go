package resilience

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memUpstream is an in-memory base RoundTripper: every request gets a
// 200 with a short body, and the count of those whose context
// AttemptFromContext describes.
type memUpstream struct{ described atomic.Int64 }

func (m *memUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	if _, ok := AttemptFromContext(r.Context()); ok {
		m.described.Add(1)
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Request: r,
		Body: io.NopCloser(strings.NewReader("ok")), ContentLength: 2}, nil
}

// Issue 29, item 10: observers cost a successful call no allocation. A
// no-op OnEvent, or a Logger at Info (which drops the Debug records of
// EventAttempt and EventCall), allocates as much as no observer at all,
// while AttemptFromContext still describes each attempt. Hedged attempts
// build their requests the same way (attempt.request), but a hedging race's
// goroutines allocate a varying amount from run to run, so no exact count
// is asserted for them.
func TestHooksCostNoAllocation(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	hooks := []struct {
		name string
		set  func(*Options)
	}{
		{"OnEvent no-op", func(o *Options) { o.OnEvent = func(Event) {} }},
		{"Logger at Info to io.Discard", func(o *Options) { o.Logger = logger }},
	}
	for _, tc := range []struct {
		name   string
		opts   Options
		method string
		body   string
	}{
		{"defaults, GET", Options{}, http.MethodGet, ""},
		{"defaults, POST with a body", Options{}, http.MethodPost, "charge"},
		{"endpoints, GET", Options{Endpoints: []Endpoint{{URL: "http://a.invalid"}, {URL: "http://b.invalid"}}}, http.MethodGet, ""},
		{"propagation, GET", Options{Propagation: PropagationOptions{Enabled: true}}, http.MethodGet, ""},
		{"no timeouts, GET", Options{TotalTimeout: -1, AttemptTimeout: -1}, http.MethodGet, ""},
		// With no deadline, nothing to repeat and no body, the caller's
		// request is sent as it is; an attempt context needs a request of
		// its own, which is the call's (call.first): no allocation either
		// (one until the call held it, two before that).
		{"no timeouts, POST without a body", Options{TotalTimeout: -1, AttemptTimeout: -1}, http.MethodPost, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := func(o Options) (float64, int64) {
				up := &memUpstream{}
				tr, err := NewTransport(up, o)
				require.NoError(t, err)
				var failed error
				call := func() {
					var body io.Reader
					if tc.body != "" {
						body = strings.NewReader(tc.body)
					}
					req, err := http.NewRequestWithContext(context.Background(), tc.method, "http://up.invalid/items", body)
					if err != nil {
						failed = err
						return
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						failed = err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				// Warmed up, so that what the process allocates once (a
				// hedge's goroutine, a timer slot) is not counted.
				for range 200 {
					call()
				}
				n := testing.AllocsPerRun(200, call)
				require.NoError(t, failed)
				return n, up.described.Load()
			}
			none, described := allocs(tc.opts)
			assert.Zero(t, described, "without observers, attempts are not described")
			for _, hk := range hooks {
				o := tc.opts
				hk.set(&o)
				with, described := allocs(o)
				assert.Equal(t, none, with, "%s: allocations per call", hk.name)
				assert.Positive(t, described, "%s: AttemptFromContext describes each attempt", hk.name)
			}
		})
	}
}
