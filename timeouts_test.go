package resilience

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 8, item 2: every timeout net/http and net raise is a transient
// failure of the attempt, retried and counted by the circuit breaker and
// the retry budget, although it says errors.Is(err,
// context.DeadlineExceeded). Only the request context's own deadline is the
// caller's.

// timeoutUpstream answers with 200, over HTTP/2 and TLS when tlsH2, and
// when hang, holds its first request until the client gives up on it.
func timeoutUpstream(t *testing.T, tlsH2, hang bool) (*httptest.Server, *atomic.Int64, chan struct{}) {
	var n atomic.Int64
	arrived := make(chan struct{}, 1)
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 && hang {
			arrived <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	if tlsH2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(func() {
		close(stop)
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv, &n, arrived
}

// timeoutOptions retries GETs at once and opens the circuit on the first
// failure of at least two attempts (so one failure shows in its metrics).
func timeoutOptions() Options {
	return Options{
		Retry:          quickRetry(),
		AttemptTimeout: -1, // only the transport's own timeouts fire
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 1, MinimumThroughput: 100, SamplingDuration: time.Minute},
	}
}

// checkRetriedTimeout sends a GET through a handler over base and checks
// that the first attempt's transport timeout was retried, counted as a
// failure by the breaker and took a token from the budget.
func checkRetriedTimeout(t *testing.T, base http.RoundTripper, url string, hits *atomic.Int64) {
	t.Helper()
	checkRetried(t, base, url, hits, true)
}

// checkRetried is checkRetriedTimeout for a failure that need not be a
// timeout.
func checkRetried(t *testing.T, base http.RoundTripper, url string, hits *atomic.Int64, timeout bool) {
	t.Helper()
	var retried []Event
	var mu sync.Mutex
	opts := timeoutOptions()
	opts.OnEvent = func(e Event) {
		if e.Kind == EventRetry {
			mu.Lock()
			retried = append(retried, e)
			mu.Unlock()
		}
	}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(base)}
	resp, err := client.Get(url)
	require.NoError(t, err, "the transport's timeout must be retried")
	assert.Equal(t, "ok", readBody(t, resp))
	if hits != nil {
		assert.EqualValues(t, 2, hits.Load())
	}
	mu.Lock()
	require.Len(t, retried, 1)
	assert.True(t, !timeout || errors.Is(retried[0].Err, context.DeadlineExceeded) || isTimeout(retried[0].Err),
		"the first attempt failed on a timeout, got %v", retried[0].Err)
	mu.Unlock()
	m := h.shared.breaker().Metrics()
	assert.EqualValues(t, 1, m.Failures(), "the breaker counts the timeout as a failure")
	assert.EqualValues(t, 1, m.Successes())
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestTimeoutResponseHeadersHTTP1Retried(t *testing.T) {
	srv, hits, _ := timeoutUpstream(t, false, true)
	base := &http.Transport{ResponseHeaderTimeout: 30 * time.Millisecond}
	defer base.CloseIdleConnections()
	checkRetriedTimeout(t, base, srv.URL, hits)
}

func TestTimeoutResponseHeadersHTTP2Retried(t *testing.T) {
	srv, hits, _ := timeoutUpstream(t, true, true)
	base := srv.Client().Transport.(*http.Transport).Clone()
	base.ResponseHeaderTimeout = 30 * time.Millisecond
	defer base.CloseIdleConnections()
	checkRetriedTimeout(t, base, srv.URL, hits)
}

func TestTimeoutDialRetried(t *testing.T) {
	srv, hits, _ := timeoutUpstream(t, false, false)
	var dials atomic.Int64
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{}
		if dials.Add(1) == 1 {
			d.Timeout = time.Nanosecond // a dial that times out, as net.Dialer.Timeout makes it
		}
		return d.DialContext(ctx, network, addr)
	}}
	defer base.CloseIdleConnections()
	checkRetriedTimeout(t, base, srv.URL, nil)
	assert.EqualValues(t, 2, dials.Load())
	assert.EqualValues(t, 1, hits.Load(), "the first attempt never reached the upstream")
}

func TestTimeoutTLSHandshakeRetried(t *testing.T) {
	srv, hits, _ := timeoutUpstream(t, true, false)
	// A listener that accepts and never speaks: the handshake times out.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		heldMu.Lock()
		for _, c := range held {
			c.Close()
		}
		heldMu.Unlock()
	})
	var dials atomic.Int64
	base := srv.Client().Transport.(*http.Transport).Clone()
	base.TLSHandshakeTimeout = 30 * time.Millisecond
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			addr = silent.Addr().String()
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	defer base.CloseIdleConnections()
	checkRetriedTimeout(t, base, srv.URL, nil)
	assert.EqualValues(t, 2, dials.Load())
	assert.EqualValues(t, 1, hits.Load(), "the first attempt never reached the upstream")
}

// An HTTP/2 connection whose peer stops answering is closed by the
// transport's health check (a ping after SendPingTimeout of silence, then
// PingTimeout): the attempt on it failed ("http2: client connection
// lost"), and is retried on a new one.
func TestTimeoutHTTP2PingRetried(t *testing.T) {
	srv, hits, arrived := timeoutUpstream(t, true, true)
	proxy := newBlackholeProxy(t, srv.Listener.Addr().String())
	base := srv.Client().Transport.(*http.Transport).Clone()
	base.HTTP2 = &http.HTTP2Config{SendPingTimeout: 20 * time.Millisecond, PingTimeout: 20 * time.Millisecond}
	defer base.CloseIdleConnections()
	go func() {
		<-arrived
		proxy.blackholeAll() // the connection of the first attempt goes silent
	}()
	checkRetried(t, base, "https://"+proxy.addr(), hits, false)
}

// A hedge that is healthy is not cancelled because another attempt hit a
// transport timeout: that attempt failed, it did not win.
func TestTimeoutHedgedTransportTimeoutDoesNotWin(t *testing.T) {
	var n atomic.Int64
	firstGone := make(chan struct{})
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			select {
			case <-r.Context().Done(): // the transport's header timeout closed it
				close(firstGone)
			case <-stop:
			}
			return
		}
		select { // the hedge answers once the first attempt has failed
		case <-firstGone:
		case <-stop:
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	defer close(stop)
	base := &http.Transport{ResponseHeaderTimeout: 100 * time.Millisecond}
	defer base.CloseIdleConnections()
	tr, err := NewTransport(base, Options{AttemptTimeout: -1, Hedging: HedgingOptions{Enabled: true, Delay: 50 * time.Millisecond}})
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	require.NoError(t, err, "the first attempt's timeout must not win over the healthy hedge")
	assert.Equal(t, "ok", readBody(t, resp))
	assert.EqualValues(t, 2, n.Load())
}

// The caller's own deadline is never retried nor counted, however the
// transport reports it.
func TestTimeoutCallerDeadlineNotRetried(t *testing.T) {
	srv, hits, _ := timeoutUpstream(t, false, true)
	h, err := NewHandler(timeoutOptions())
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: h.Transport(base), Timeout: 30 * time.Millisecond}
	_, err = client.Get(srv.URL)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, hits.Load())
	assert.Zero(t, h.shared.breaker().Metrics().Executions(), "the caller's deadline says nothing of the upstream")
	assert.Equal(t, float64(defaultBudgetTokens), h.budget.Level())
}

// blackholeProxy forwards TCP connections to a backend until told to drop
// everything on the connections it has, which then go silent both ways.
type blackholeProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []*proxyConn
	wg      sync.WaitGroup
	backend string
}

type proxyConn struct {
	client, server net.Conn
	silent         atomic.Bool
}

func newBlackholeProxy(t *testing.T, backend string) *blackholeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, backend: backend}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) addr() string { return p.ln.Addr().String() }

func (p *blackholeProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pc, c, s)
		go p.pipe(pc, s, c)
	}
}

func (p *blackholeProxy) pipe(pc *proxyConn, from, to net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !pc.silent.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			pc.client.Close()
			pc.server.Close()
			return
		}
	}
}

func (p *blackholeProxy) blackholeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.silent.Store(true)
	}
}

func (p *blackholeProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, pc := range p.conns {
		pc.client.Close()
		pc.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Issue 31: an attempt that reaches AttemptTimeout while nothing sent
// after it has been answered, and others wait with it at an upstream that
// answers, is queued behind them, not stuck. Cut short, the upstream would
// still serve it, to nobody, and its retry would queue again: it waits on,
// up to TotalTimeout, and says so (EventAttemptHeld). StrictAttemptTimeout
// cuts it as before.
func TestAttemptQueuedBehindOthersWaitsOn(t *testing.T) {
	for _, strict := range []bool{false, true} {
		name := map[bool]string{false: "default", true: "strict"}[strict]
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			arrived := make(chan struct{}, 8)
			var hits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/warm" {
					return // served at once: the upstream answers
				}
				hits.Add(1)
				arrived <- struct{}{}
				select { // a queue: the answer comes once the test lets it
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "ok")
			}))
			defer srv.Close()
			rec := &evRecorder{}
			tr, err := NewTransport(&http.Transport{}, Options{
				AttemptTimeout:       20 * time.Millisecond,
				StrictAttemptTimeout: strict,
				TotalTimeout:         5 * time.Second,
				Retry:                RetryOptions{Delay: time.Millisecond, MaxRetries: 1},
				OnEvent:              rec.add,
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			resp, err := client.Get(srv.URL + "/warm")
			require.NoError(t, err)
			resp.Body.Close()
			if strict {
				defer close(release) // never answered while the calls wait
			} else {
				go func() {
					<-arrived
					<-arrived
					time.Sleep(100 * time.Millisecond) // five attempt timeouts: the timers have fired
					close(release)
				}()
			}
			errs := make(chan error, 2)
			for range 2 {
				go func() {
					resp, err := client.Get(srv.URL)
					if err == nil {
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if string(body) != "ok" {
							err = fmt.Errorf("body %q", body)
						}
					}
					errs <- err
				}()
			}
			for range 2 {
				err := <-errs
				if strict {
					// Cut at 20 ms and retried; the retry queues as well
					// and is cut too, and the call ends on the timeout.
					require.ErrorIs(t, err, ErrAttemptTimeout)
				} else {
					require.NoError(t, err)
				}
			}
			if strict {
				assert.Equal(t, 4, rec.count(EventAttemptTimeout))
				assert.Zero(t, rec.count(EventAttemptHeld))
				return
			}
			assert.Equal(t, int64(2), hits.Load(), "one attempt per call, served to its caller")
			assert.Zero(t, rec.count(EventAttemptTimeout))
			held := rec.of(EventAttemptHeld)
			require.Len(t, held, 2)
			for _, e := range held {
				assert.Equal(t, 1, e.Attempt)
				assert.GreaterOrEqual(t, e.Duration, 20*time.Millisecond)
			}
		})
	}
}

// An attempt still waiting at AttemptTimeout after the upstream has
// answered one sent later is stuck: it is cut short and retried, as a
// lone attempt always was.
func TestAttemptOvertakenIsCut(t *testing.T) {
	arrived := make(chan struct{}, 1)
	stop := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stuck" && hits.Add(1) == 1 {
			arrived <- struct{}{}
			select { // the first attempt hangs
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	defer close(stop)
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		AttemptTimeout: 40 * time.Millisecond,
		TotalTimeout:   5 * time.Second,
		Retry:          RetryOptions{Delay: time.Millisecond},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	done := make(chan error, 1)
	go func() {
		resp, err := client.Get(srv.URL + "/stuck")
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-arrived
	time.Sleep(20 * time.Millisecond) // more than a quarter of the limit after the stuck one was sent
	resp, err := client.Get(srv.URL + "/other")
	require.NoError(t, err)
	resp.Body.Close()

	require.NoError(t, <-done, "cut, then retried")
	assert.Equal(t, int64(2), hits.Load())
	timeouts := rec.of(EventAttemptTimeout)
	require.Len(t, timeouts, 1)
	assert.Equal(t, 1, timeouts[0].Attempt)
}

// A refusal sent later shows nothing about an attempt still queued: the
// upstream answered it without serving it. The queued attempt is held,
// not cut and sent again to the back of the queue, whether the refusal is
// retried (a fast 503 from an upstream shedding new arrivals) or not (a
// server half's pushback).
func TestAttemptNotOvertakenByRefusal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pushback bool
		refusals int64 // attempts of /other
	}{
		{"a 503 it retries", false, 2},
		{"a pushback it does not retry", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			release := make(chan struct{})
			var stuck, refused atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/warm" {
					return // served: the upstream answers (deadlines.holds)
				}
				if r.URL.Path == "/other" {
					refused.Add(1)
					if tc.pushback {
						w.Header().Set("Retry-Pushback-Ms", "-1")
					}
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				if stuck.Add(1) == 1 {
					arrived <- struct{}{}
				}
				select { // queued: served once the test lets it
				case <-r.Context().Done():
					return
				case <-release:
				}
				_, _ = io.WriteString(w, "ok")
			}))
			defer srv.Close()
			rec := &evRecorder{}
			tr, err := NewTransport(&http.Transport{}, Options{
				AttemptTimeout: 40 * time.Millisecond,
				TotalTimeout:   5 * time.Second,
				Retry:          RetryOptions{Delay: time.Millisecond, MaxRetries: 1},
				Propagation:    PropagationOptions{Enabled: tc.pushback},
				OnEvent:        rec.add,
			})
			require.NoError(t, err)
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}

			resp, err := client.Get(srv.URL + "/warm")
			require.NoError(t, err)
			resp.Body.Close()
			// Two queue, one behind the other: neither waits alone.
			done := make(chan error, 2)
			for range 2 {
				go func() {
					resp, err := client.Get(srv.URL + "/queued")
					if err == nil {
						resp.Body.Close()
					}
					done <- err
				}()
			}
			<-arrived
			time.Sleep(20 * time.Millisecond) // more than a quarter of the limit after the queued ones were sent
			resp, err = client.Get(srv.URL + "/other")
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			time.Sleep(100 * time.Millisecond) // past the queued attempt's limit, twice
			close(release)

			require.NoError(t, <-done)
			require.NoError(t, <-done)
			assert.Equal(t, int64(2), stuck.Load(), "held, not cut and sent again")
			assert.Equal(t, tc.refusals, refused.Load())
			assert.Equal(t, tc.pushback, rec.count(EventPushback) == 1)
			assert.Zero(t, rec.count(EventAttemptTimeout))
			held := rec.of(EventAttemptHeld)
			require.Len(t, held, 2)
			assert.Equal(t, 1, held[0].Attempt)
			assert.Equal(t, 1, held[1].Attempt)
		})
	}
}
