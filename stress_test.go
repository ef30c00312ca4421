package resilience

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/resiliencetest"
)

// TestStress runs 64 goroutines through one shared Handler against a flaky
// loopback upstream, with caller cancellations, request bodies of every kind
// and responses read in every way, through a baseline phase, an outage that
// opens the circuit, and a recovery that closes it. Everything it asserts is
// an invariant that holds whatever the interleaving:
//
//   - every call ends in a response or in one of the documented errors;
//   - every request body the upstream received in full is the one the caller
//     sent, and every response body the caller read in full is the one the
//     upstream sent, for that call;
//   - the method rule holds: a request that may not be repeated reaches the
//     upstream at most once, one that may at most MaxRetries+1 times;
//   - the circuit opened and closed; success, open-circuit and admission
//     rejections each happened;
//   - afterwards every concurrency permit is back, every request body was
//     closed, no client or server connection is left open once idle ones are
//     closed, and the connections opened stay far below one per attempt.
//
// The upstream is a real httptest server of the test's own, on loopback, that
// plays a resiliencetest Script on the wire (hangs, TCP resets, delays,
// statuses with bodies) and checks request bodies: resiliencetest.Server can
// do the former but not the latter, as it discards request bodies and takes
// no handler. A resiliencetest.Transport sits between the handler and the
// http.Transport to add client-side faults (resets and delays without a
// network), so both halves of the kit are exercised.
func TestStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	const (
		workers       = 64
		maxConcurrent = 32
		maxQueue      = 16
		maxBuffered   = 4 << 10
		maxRetries    = 3
		seed          = 0x5eed
		phaseRequests = 800 // upstream requests in the baseline and in the recovery
	)

	// Seeded random payloads: response bodies of the script, and the pool
	// request bodies are cut from.
	rng := rand.New(rand.NewPCG(seed, 1))
	pool := stressRandomBytes(rng, 96<<10)
	small := stressRandomBytes(rng, 300)
	large := stressRandomBytes(rng, 64<<10+123)
	chunked := stressRandomBytes(rng, stressChunkedSize)
	errPage := stressRandomBytes(rng, 1<<10)

	var outage atomic.Bool
	mix := resiliencetest.Mix(seed,
		resiliencetest.Weighted{Weight: 20, Fault: resiliencetest.Fault{}}, // 200, 0 B
		resiliencetest.Weighted{Weight: 20, Fault: resiliencetest.Fault{Body: small}},
		resiliencetest.Weighted{Weight: 6, Fault: resiliencetest.Fault{Body: large}},
		resiliencetest.Weighted{Weight: 4, Fault: resiliencetest.Fault{Body: chunked}},
		resiliencetest.Weighted{Weight: 10, Fault: resiliencetest.Fault{Delay: 3 * time.Millisecond, Body: small}},
		resiliencetest.Weighted{Weight: 8, Fault: resiliencetest.Fault{Status: http.StatusServiceUnavailable, Body: errPage}},
		resiliencetest.Weighted{Weight: 6, Fault: resiliencetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: "0"}},
		resiliencetest.Weighted{Weight: 2, Fault: resiliencetest.Fault{Hang: true}},
		resiliencetest.Weighted{Weight: 3, Fault: resiliencetest.Fault{Reset: true}},
	)
	outageFault := resiliencetest.Fault{Status: http.StatusServiceUnavailable, Body: errPage}
	script := resiliencetest.Func(func(int) resiliencetest.Fault {
		f := mix.Next() // drawn even in the outage, so the mix stays in request order
		if outage.Load() {
			return outageFault
		}
		return f
	})
	up := newStressUpstream(t, script)

	conns := &stressConnCounter{}
	base := &http.Transport{
		DialContext:         conns.dial,
		MaxIdleConns:        100,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	faults := resiliencetest.NewTransport(base, resiliencetest.Mix(seed+1,
		resiliencetest.Weighted{Weight: 92, Fault: resiliencetest.Fault{}}, // to the server
		resiliencetest.Weighted{Weight: 4, Fault: resiliencetest.Fault{Delay: 2 * time.Millisecond}},
		resiliencetest.Weighted{Weight: 4, Fault: resiliencetest.Fault{Reset: true}},
	))

	events := &stressEvents{}
	h, err := NewHandler(Options{
		Name:      "stress",
		RateLimit: RateLimitOptions{MaxConcurrent: maxConcurrent, MaxQueue: maxQueue},
		// Generous against a loaded machine: an attempt starved of CPU
		// must not time out, or the breaker never settles; hangs still do.
		TotalTimeout:    2 * time.Second,
		AttemptTimeout:  250 * time.Millisecond,
		MaxBufferedBody: maxBuffered,
		Retry: RetryOptions{
			MaxRetries: maxRetries,
			Delay:      time.Millisecond,
			MaxDelay:   2 * time.Millisecond,
			Methods:    []string{http.MethodPut},
		},
		CircuitBreaker: CircuitBreakerOptions{
			FailureRatio:      0.5,
			MinimumThroughput: 20,
			SamplingDuration:  time.Second,
			BreakDuration:     30 * time.Millisecond,
		},
		OnEvent: events.record,
	})
	require.NoError(t, err)
	tr := h.Transport(faults)
	client := &http.Client{Transport: tr}

	st := &stressState{t: t, client: client, url: up.srv.URL, pool: pool, maxBuffered: maxBuffered}
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.worker(g, rand.New(rand.NewPCG(seed, uint64(g)+2)))
		}()
	}

	// The phases: baseline, outage until the circuit has opened and a
	// half-open probe has failed, recovery until it has closed and as many
	// requests again have reached the upstream. A deadline keeps a broken
	// handler from hanging the test; it is a bound, never what an assertion
	// depends on.
	start := time.Now()
	deadline := start.Add(45 * time.Second)
	ok := true
	waitFor := func(what string, cond func() bool) {
		for ok && !cond() {
			if time.Now().After(deadline) {
				t.Errorf("stress: gave up waiting for %s after %v", what, time.Since(start))
				ok = false
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("the baseline requests", func() bool { return up.requests.Load() >= phaseRequests })
	opened := events.count(EventCircuitOpened)
	outage.Store(true)
	waitFor("the circuit to open and a probe to fail", func() bool { return events.count(EventCircuitOpened) >= opened+2 })
	outage.Store(false)
	closed := events.count(EventCircuitClosed)
	waitFor("the circuit to close", func() bool { return events.count(EventCircuitClosed) > closed })
	recovered := up.requests.Load()
	waitFor("the recovery requests", func() bool { return up.requests.Load() >= recovered+phaseRequests })
	st.stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)

	// Outcomes.
	outcomes := st.outcomes()
	t.Logf("stress: %d calls in %v; outcomes: %s", st.calls.Load(), elapsed.Round(time.Millisecond), stressFormat(outcomes))
	t.Logf("stress: kinds: %s", stressFormat(st.kindCounts()))
	t.Logf("stress: events: %s", events)
	for _, c := range []string{"ok 200", "circuit open", "rate limited"} {
		require.Positive(t, outcomes[c], "outcome %q never happened", c)
	}
	require.Zero(t, outcomes["other"], "calls ended in an error of no expected kind: %v", st.others())
	require.Positive(t, events.count(EventCircuitOpened), "the circuit never opened")
	require.Positive(t, events.count(EventCircuitClosed), "the circuit never closed")

	// Bodies, both ways, and the method rule.
	require.Empty(t, st.mismatches(), "response bodies not intact")
	up.mu.Lock()
	require.Empty(t, up.mismatches, "request bodies not intact")
	upstreamAttempts := up.attempts
	up.mu.Unlock()
	require.Positive(t, up.verified.Load(), "no request body was checked")
	st.mu.Lock()
	for id, kind := range st.kinds {
		n := upstreamAttempts[id]
		switch {
		case !kind.repeatable():
			require.LessOrEqual(t, n, 1, "call %s (%s) may not be repeated", id, kind)
		case kind != stressGet: // a GET may also be retried by http.Transport itself
			require.LessOrEqual(t, n, maxRetries+1, "call %s (%s) attempted too often", id, kind)
		}
	}
	st.mu.Unlock()

	// Admission: every permit is back and nobody is queued.
	require.Zero(t, h.shared.queued.Load(), "calls still queued for admission")
	for i := range maxConcurrent {
		require.True(t, h.shared.policies.Load().bulkhead.tryAcquire(), "concurrency permit %d of %d still held", i+1, maxConcurrent)
	}
	require.False(t, h.shared.policies.Load().bulkhead.tryAcquire(), "more permits than MaxConcurrent")
	for range maxConcurrent {
		h.shared.policies.Load().bulkhead.release()
	}

	// Connections: with the idle ones closed, none is left open at either
	// end, and every request body was closed. Connections an attempt ends
	// close asynchronously, so wait (boundedly) for the counts to settle.
	tr.CloseIdleConnections()
	settle := time.Now().Add(5 * time.Second)
	for (conns.open.Load() != 0 || up.open.Load() != 0 || st.unclosedBodies() != 0) && time.Now().Before(settle) {
		time.Sleep(5 * time.Millisecond)
		tr.CloseIdleConnections()
	}
	require.Zero(t, conns.open.Load(), "client connections left open")
	require.Zero(t, up.open.Load(), "server connections left open")
	require.Zero(t, st.unclosedBodies(), "request bodies never closed")

	// Connections are reused. Resets, attempts cut short by a timeout or a
	// cancellation, and response bodies closed before EOF each end a
	// connection (killers counts them, cancellations generously), and so
	// does the idle pool's overflow; a retried response must not: it is
	// drained and its connection goes back to the pool. Were it closed
	// instead, new connections would exceed killers by about the number of
	// retried responses; the bound allows half that.
	requests := up.requests.Load()
	newConns := up.newConns.Load()
	retried := events.retried.Load()
	killers := up.resets.Load() + events.count(EventAttemptTimeout) + events.count(EventTotalTimeout) +
		st.earlyCloses.Load() + int64(outcomes["canceled"]+outcomes["body: canceled"])
	t.Logf("stress: upstream: %d requests, %d new connections (client dialled %d), %d resets, %d hangs, %d bodies verified, %d cut short; client attempts %d",
		requests, newConns, conns.dialed.Load(), up.resets.Load(), up.hangs.Load(), up.verified.Load(), up.incomplete.Load(), faults.Requests())
	t.Logf("stress: %d retried responses; at most %d connections ended by resets, timeouts, cancellations and early closes; new connections beyond those: %d",
		retried, killers, newConns-killers)
	require.Less(t, newConns, requests, "fewer connections than attempts")
	require.LessOrEqual(t, newConns, killers+retried/2, "retried responses cost their connections")
}

// stressChunkedSize is the size of the response body the upstream sends
// without a Content-Length.
const stressChunkedSize = 100<<10 + 7

// stressKind is the kind of call a worker makes.
type stressKind int

const (
	stressGet           stressKind = iota // no body
	stressPutGetBody                      // bytes.Reader body: GetBody set
	stressPutBuffered                     // opaque body up to MaxBufferedBody: buffered for replay
	stressPutStreamed                     // opaque body over MaxBufferedBody: streamed once
	stressPostOnce                        // POST with GetBody, not retryable
	stressPostRetryable                   // POST made retryable with WithRetryable
	stressKinds
)

func (k stressKind) String() string {
	return [...]string{"GET", "PUT getbody", "PUT buffered", "PUT streamed", "POST once", "POST retryable"}[k]
}

// repeatable reports whether the handler may send a call of this kind more
// than once.
func (k stressKind) repeatable() bool { return k != stressPutStreamed && k != stressPostOnce }

// stressState is what the workers share: the client, and what they saw.
type stressState struct {
	t           *testing.T
	client      *http.Client
	url         string
	pool        []byte
	maxBuffered int

	stop        atomic.Bool
	calls       atomic.Int64
	earlyCloses atomic.Int64 // response bodies closed before EOF

	mu       sync.Mutex
	counts   map[string]int
	kinds    map[string]stressKind // by call id
	bad      []string              // response bodies not intact
	other    []string              // errors of no expected kind
	reqBodys []*testTrackingBody   // request bodies without GetBody
}

// worker makes calls until told to stop, drawing each call's kind, body,
// cancellation and way of reading the response from rng.
func (s *stressState) worker(g int, rng *rand.Rand) {
	for i := 0; !s.stop.Load(); i++ {
		id := fmt.Sprintf("%d-%d", g, i)
		kind := stressKind(rng.IntN(int(stressKinds)))
		outcome := s.call(id, kind, rng)
		s.calls.Add(1)
		if outcome == "circuit open" || outcome == "rate limited" {
			time.Sleep(5 * time.Millisecond) // a rejected client backs off a little
		}
	}
}

// call makes one call and returns its outcome's category.
func (s *stressState) call(id string, kind stressKind, rng *rand.Rand) string {
	t := s.t
	ctx := context.Background()
	if kind == stressPostRetryable {
		ctx = WithRetryable(ctx, true)
	}
	// One call in eight is cancelled by its caller after up to 20ms.
	if rng.IntN(8) == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		timer := time.AfterFunc(time.Duration(rng.IntN(20_000))*time.Microsecond, cancel)
		defer timer.Stop()
	}

	var (
		payload []byte
		body    io.Reader
		method  = http.MethodPut
		length  = int64(-1) // ContentLength to set on an opaque body; -1 leaves it unknown
	)
	switch kind {
	case stressGet:
		method = http.MethodGet
	case stressPutGetBody:
		payload = s.payload(rng, []int{0, 1, 300, 4 << 10, 40 << 10}[rng.IntN(5)])
		body = bytes.NewReader(payload)
	case stressPutBuffered:
		payload = s.payload(rng, 1+rng.IntN(s.maxBuffered)) // up to the limit, included
		if rng.IntN(2) == 0 {
			length = int64(len(payload))
		}
	case stressPutStreamed:
		payload = s.payload(rng, s.maxBuffered+1+rng.IntN(60<<10)) // over the limit, by 1 byte or more
		if rng.IntN(2) == 0 {
			length = int64(len(payload))
		}
	case stressPostOnce, stressPostRetryable:
		method = http.MethodPost
		payload = s.payload(rng, rng.IntN(8<<10))
		body = bytes.NewReader(payload)
	}
	var tracked *testTrackingBody
	if kind == stressPutBuffered || kind == stressPutStreamed {
		tracked = newTestTrackingBody(payload) // hides WriterTo and Len: no GetBody
		body = tracked
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+"/"+id, body)
	if err != nil {
		t.Errorf("stress: %v", err)
		return "other"
	}
	if length >= 0 {
		req.ContentLength = length
	}
	req.Header.Set("X-Stress-Call", id)
	req.Header.Set("X-Body-Sha256", stressSum(payload))
	if !kind.repeatable() {
		req.Header.Set("X-Stress-Once", "1")
	}
	s.mu.Lock()
	if s.kinds == nil {
		s.kinds = make(map[string]stressKind)
	}
	s.kinds[id] = kind
	if tracked != nil {
		s.reqBodys = append(s.reqBodys, tracked)
	}
	s.mu.Unlock()

	resp, err := s.client.Do(req)
	if err != nil {
		return s.count(kind, "", err)
	}
	// Read the body one of three ways: to EOF without Close, partly and
	// Closed, or in full and Closed.
	var got []byte
	switch mode := rng.IntN(3); mode {
	case 0, 2:
		got, err = io.ReadAll(resp.Body)
		if mode == 2 || err != nil {
			resp.Body.Close()
		}
	case 1:
		buf := make([]byte, rng.IntN(64))
		_, err = io.ReadFull(resp.Body, buf)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			err = nil // a body shorter than asked for
		}
		resp.Body.Close()
		if err == nil && resp.ContentLength != 0 {
			s.earlyCloses.Add(1) // closed before EOF: the connection goes
		}
		if err != nil {
			return s.count(kind, "body: ", err)
		}
		return s.count(kind, "", nil, resp.StatusCode)
	}
	if err != nil {
		return s.count(kind, "body: ", err)
	}
	s.verify(id, resp, got)
	return s.count(kind, "", nil, resp.StatusCode)
}

// payload is n bytes of the pool, from a random offset.
func (s *stressState) payload(rng *rand.Rand, n int) []byte {
	off := rng.IntN(len(s.pool) - n + 1)
	return s.pool[off : off+n : off+n]
}

// verify checks a response body read in full against what the upstream
// says it sent for this call.
func (s *stressState) verify(id string, resp *http.Response, got []byte) {
	var problems []string
	if echo := resp.Header.Get("X-Stress-Call"); echo != id {
		problems = append(problems, fmt.Sprintf("answer to call %q", echo))
	}
	if want := resp.Header.Get("X-Body-Sha256"); want == "" || want != stressSum(got) {
		problems = append(problems, fmt.Sprintf("sha256 %.12s, want %.12s", stressSum(got), want))
	}
	if resp.ContentLength >= 0 && int64(len(got)) != resp.ContentLength {
		problems = append(problems, fmt.Sprintf("%d bytes, Content-Length %d", len(got), resp.ContentLength))
	}
	if len(got) > 0 && !bytes.HasPrefix(got, []byte(id+"\n")) {
		problems = append(problems, "body of another call")
	}
	if len(problems) > 0 {
		s.mu.Lock()
		s.bad = append(s.bad, fmt.Sprintf("call %s status %d: %s", id, resp.StatusCode, strings.Join(problems, "; ")))
		s.mu.Unlock()
	}
}

// count records a call's outcome: a response's status, or the category of
// its error.
func (s *stressState) count(kind stressKind, prefix string, err error, status ...int) string {
	var c string
	switch {
	case err == nil:
		c = "ok " + strconv.Itoa(status[0])
		if status[0] != http.StatusOK {
			c = "response " + strconv.Itoa(status[0])
		}
	case errors.Is(err, ErrCircuitOpen):
		c = "circuit open"
	case errors.Is(err, ErrRateLimited):
		c = "rate limited"
	case errors.Is(err, ErrTotalTimeout):
		c = "total timeout"
	case errors.Is(err, ErrAttemptTimeout):
		c = "attempt timeout"
	case errors.Is(err, context.Canceled):
		c = "canceled"
	case stressTransportError(err):
		c = "transport error"
	default:
		c = "other"
	}
	c = prefix + c
	s.mu.Lock()
	if s.counts == nil {
		s.counts = make(map[string]int)
	}
	s.counts[c]++
	s.counts["kind "+kind.String()]++
	if strings.HasSuffix(c, "other") && len(s.other) < 10 {
		s.other = append(s.other, fmt.Sprintf("%s: %v", kind, err))
	}
	s.mu.Unlock()
	return c
}

// stressTransportError reports an error of the connection: a reset, a
// broken pipe, or a connection that ended early.
func stressTransportError(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &op)
}

func (s *stressState) outcomes() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int)
	for k, v := range s.counts {
		if !strings.HasPrefix(k, "kind ") {
			m[k] = v
		}
	}
	return m
}

func (s *stressState) kindCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int)
	for k, v := range s.counts {
		if name, ok := strings.CutPrefix(k, "kind "); ok {
			m[name] = v
		}
	}
	return m
}

func (s *stressState) others() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.other...)
}

func (s *stressState) mismatches() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bad...)
}

func (s *stressState) unclosedBodies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.reqBodys {
		if !b.closed.Load() {
			n++
		}
	}
	return n
}

// stressUpstream is the upstream: it plays script on the wire, checks every
// request body it reads in full against the X-Body-Sha256 the client sent,
// counts attempts per call, and sends each response body prefixed with the
// call's id and with its checksum in X-Body-Sha256.
type stressUpstream struct {
	srv    *httptest.Server
	script *resiliencetest.Script
	stop   chan struct{} // closed at the end: releases hanging handlers

	requests, newConns, open atomic.Int64
	resets, hangs            atomic.Int64
	verified, incomplete     atomic.Int64

	mu         sync.Mutex
	attempts   map[string]int // by call id
	mismatches []string
}

func newStressUpstream(t *testing.T, script *resiliencetest.Script) *stressUpstream {
	u := &stressUpstream{script: script, stop: make(chan struct{}), attempts: make(map[string]int)}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.newConns.Add(1)
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}
	u.srv.Start()
	t.Cleanup(func() {
		close(u.stop)
		u.srv.Close()
	})
	return u
}

func (u *stressUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	f := u.script.Next()
	id := r.Header.Get("X-Stress-Call")
	u.mu.Lock()
	u.attempts[id]++
	u.mu.Unlock()
	if f.Reset {
		// Before reading the body: the client may be in the middle of it.
		u.resets.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
		return
	}
	got, err := io.ReadAll(r.Body)
	if err != nil {
		u.incomplete.Add(1) // the client gave up while sending it
		return
	}
	if want := r.Header.Get("X-Body-Sha256"); stressSum(got) != want {
		u.mu.Lock()
		u.mismatches = append(u.mismatches, fmt.Sprintf("call %s %s: got %d bytes, sha256 %.12s, want %.12s",
			id, r.Method, len(got), stressSum(got), want))
		u.mu.Unlock()
	} else {
		u.verified.Add(1)
	}
	if f.Delay > 0 {
		timer := time.NewTimer(f.Delay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return
		case <-u.stop:
			timer.Stop()
			return
		}
	}
	if f.Hang {
		u.hangs.Add(1)
		select {
		case <-r.Context().Done():
		case <-u.stop:
		}
		return
	}
	var body []byte
	if len(f.Body) > 0 {
		body = append([]byte(id+"\n"), f.Body...)
	}
	h := w.Header()
	h.Set("X-Stress-Call", id)
	h.Set("X-Body-Sha256", stressSum(body))
	if f.RetryAfter != "" {
		h.Set("Retry-After", f.RetryAfter)
	}
	if len(f.Body) != stressChunkedSize {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	status := f.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// stressConnCounter dials the client's connections and counts those opened
// and those still open.
type stressConnCounter struct {
	dialed, open atomic.Int64
}

func (c *stressConnCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.dialed.Add(1)
	c.open.Add(1)
	return &stressConn{Conn: conn, c: c}, nil
}

type stressConn struct {
	net.Conn
	c    *stressConnCounter
	once sync.Once
}

func (s *stressConn) Close() error {
	s.once.Do(func() { s.c.open.Add(-1) })
	return s.Conn.Close()
}

// stressEvents counts a handler's events by kind.
type stressEvents struct {
	n       [len(eventKindNames)]atomic.Int64
	retried atomic.Int64 // retries after a response, which was drained
}

func (e *stressEvents) record(ev Event) {
	e.n[ev.Kind].Add(1)
	if ev.Kind == EventRetry && ev.StatusCode != 0 {
		e.retried.Add(1)
	}
}

func (e *stressEvents) count(k EventKind) int64 { return e.n[k].Load() }

func (e *stressEvents) String() string {
	var parts []string
	for k := EventRetry; k <= EventRateLimited; k++ {
		parts = append(parts, fmt.Sprintf("%s=%d", k, e.count(k)))
	}
	return strings.Join(parts, " ")
}

func stressSum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func stressRandomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func stressFormat(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
