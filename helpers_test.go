package resilience

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/stretchr/testify/require"
)

// testUpstream is an httptest server that counts the requests it gets and
// the new TCP connections it accepts, and records each request's method
// and body (read in full before the handler runs).
type testUpstream struct {
	srv      *httptest.Server
	requests atomic.Int64
	newConns atomic.Int64
	stop     chan struct{} // closed when the test ends: unblocks hanging handlers

	mu      sync.Mutex
	bodies  [][]byte
	methods []string
}

// newTestUpstream starts a server whose handler is h; n is the request's
// number, counting from 1. The server is shut down when the test ends.
func newTestUpstream(t *testing.T, h func(w http.ResponseWriter, r *http.Request, n int)) *testUpstream {
	t.Helper()
	u := &testUpstream{stop: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, body)
		u.methods = append(u.methods, r.Method)
		u.mu.Unlock()
		h(w, r, int(u.requests.Add(1)))
	}))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.newConns.Add(1)
		}
	}
	u.srv.Start()
	t.Cleanup(func() {
		close(u.stop)
		u.srv.CloseClientConnections()
		u.srv.Close()
	})
	return u
}

func (u *testUpstream) URL() string { return u.srv.URL }

// Bodies returns the request bodies the server received, in order.
func (u *testUpstream) Bodies() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]byte(nil), u.bodies...)
}

// Methods returns the request methods the server received, in order.
func (u *testUpstream) Methods() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.methods...)
}

// hang blocks a handler until the client gives up on the request (its
// connection closes) or the test ends.
func (u *testUpstream) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-u.stop:
	}
}

// resetConn hijacks the request's connection and closes it with a TCP RST,
// without writing a response.
func resetConn(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// testAttemptCounter is a base RoundTripper that counts the attempts the
// handler sends, on the client side: deterministic even when an attempt is
// cancelled before the server sees it.
type testAttemptCounter struct {
	base   *http.Transport
	n      atomic.Int64
	before func(*http.Request) // when set, called before each attempt is sent
}

func (c *testAttemptCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	if c.before != nil {
		c.before(r)
	}
	return c.base.RoundTrip(r)
}

func (c *testAttemptCounter) CloseIdleConnections() { c.base.CloseIdleConnections() }

// testEventLog records a handler's events.
type testEventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *testEventLog) record(e Event) {
	if e.Kind == EventAttempt || e.Kind == EventCall {
		return // every call emits these; events_test.go looks at them
	}
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *testEventLog) ofKind(k EventKind) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// testClient is an http.Client over a fresh Transport built from opts, on
// a fresh base http.Transport whose attempts are counted. Its events are
// recorded unless opts.OnEvent is set; its idle connections are closed
// when the test ends.
type testClient struct {
	*http.Client
	tr       *Transport
	attempts *testAttemptCounter
	events   *testEventLog
}

func newTestClient(t *testing.T, opts Options) *testClient {
	t.Helper()
	c := &testClient{
		attempts: &testAttemptCounter{base: http.DefaultTransport.(*http.Transport).Clone()},
		events:   &testEventLog{},
	}
	if opts.OnEvent == nil {
		opts.OnEvent = c.events.record
	}
	tr, err := NewTransport(c.attempts, opts)
	require.NoError(t, err)
	c.tr = tr
	c.Client = &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// quickRetry is a retry configuration whose computed delays are 1ms, so
// that tests never wait on backoff.
func quickRetry() RetryOptions {
	return RetryOptions{Delay: time.Millisecond, MaxDelay: time.Millisecond, NoJitter: true}
}

// readBody reads resp's body in full and closes it.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// testTrackingBody is a request body without GetBody that records how many
// bytes were read from it and whether it was closed.
type testTrackingBody struct {
	r      io.Reader
	read   atomic.Int64
	closed atomic.Bool
}

func newTestTrackingBody(b []byte) *testTrackingBody {
	return &testTrackingBody{r: &testOpaqueReader{b: b}}
}

func (b *testTrackingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *testTrackingBody) Close() error {
	b.closed.Store(true)
	return nil
}

// testOpaqueReader is a reader http.NewRequest does not recognise, so it
// sets no GetBody and no ContentLength for it.
type testOpaqueReader struct {
	b []byte
	i int
}

func (r *testOpaqueReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

// newTestRequest builds a request, failing the test on error.
func newTestRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	require.NoError(t, err)
	return req
}

// getBounded sends a GET whose context ends after 10s, so that a handler
// that fails to enforce its own deadlines fails the test instead of
// hanging it. The context lives until the test ends (the body may be read
// after getBounded returns).
func (c *testClient) getBounded(t *testing.T, url string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c.Do(newTestRequest(t, ctx, http.MethodGet, url, nil))
}

// breaker returns s's failsafe-go circuit breaker, nil when disabled.
func (s *hostState) breaker() circuitbreaker.CircuitBreaker[any] { return s.circuit.Breaker() }
