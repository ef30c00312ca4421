package bench

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The overload experiment's upstream (issue 19): an httptest server on
// loopback with a fixed number of workers and one FIFO queue in front of
// them, so its capacity is workers / service time. A request waits in the
// queue for a worker, holds it for the service time (deterministic: an
// M/D/c queue), and is answered 200. Nothing is shed.
//
// Two modes decide what happens to a request whose caller has gone:
//   - oblivious: the server cannot see the disconnect until it writes (a
//     thread-per-request server that reads the request once and never looks
//     at the socket again): it serves every queued request, dead or not;
//   - aware: before starting service it checks the request's context (Go's
//     server cancels it when the client closes the connection; behind
//     package server's middleware, also when the budget the caller sent has
//     run out) and drops the request if its caller left or its deadline
//     passed, answering 503 as http.TimeoutHandler does (a caller that left
//     reads nothing; one whose budget ran out while it still waits reads
//     the refusal). Work already started is never cut short.
//   - shedding (ovlUpstreamConfig.shed): aware, and its queue is bounded:
//     a request that finds it full is refused with a 503, which first
//     takes a worker for rejectCost, ahead of the queue, as a server's
//     accept path sheds before it serves.
//
// Whether the work was wasted is not read from the request's context (the
// oblivious server must not look at it): every attempt carries an id in
// ovlAttemptHeader, set by the client-side base (ovlBase), which marks the
// attempt ended in a shared registry when its round trip returned without a
// response (the attempt timed out, or the call ended). Busy time spent on an
// attempt that had ended by the time its service finished is wasted: nobody
// reads the answer.
//
// The trigger changes the service time (for services that start during it),
// the number of workers that may be in service, or stalls every worker (a
// service that overlaps the stall is pushed back by the overlap).
const ovlAttemptHeader = "X-Ovl-Attempt"

// ovlWindow is the recording window: every timeline has one point per
// ovlWindow.
const ovlWindow = 250 * time.Millisecond

// ovlUpWindow is what the upstream saw in one window.
type ovlUpWindow struct {
	arrivals    int           // attempts arriving
	completions int           // services finished (dead or alive), and refusals (shed)
	dropped     int           // aware mode: left unserved, caller gone or deadline passed
	queueArea   time.Duration // ∫ queue length dt over the window
	busy        time.Duration // worker time in service
	wasted      time.Duration // of busy, on attempts whose caller had given up
}

// queue is the time-weighted mean queue length over the window.
func (w ovlUpWindow) queue() float64 { return w.queueArea.Seconds() / ovlWindow.Seconds() }

// ovlUpstreamConfig is the upstream's shape and its trigger.
type ovlUpstreamConfig struct {
	workers int
	service time.Duration
	aware   bool
	// shed, when > 0, bounds the queue: a request that finds shed waiting
	// is refused with a 503, which takes a worker for rejectCost first,
	// ahead of the queue (a server's accept path sheds before it serves).
	shed       int
	rejectCost time.Duration
	retryAfter string // the Retry-After header of a shed 503, if not ""
	trigger    ovlTrigger
	span       time.Duration // windows are recorded over [0, span)
	h2         bool          // served over TLS with HTTP/2 (httptest's StartTLS); plain HTTP/1.1 if false
}

// ovlTrigger is what goes wrong, when, for how long. A zero trigger changes
// nothing.
type ovlTrigger struct {
	name     string
	at, dur  time.Duration
	slow     float64 // service time multiplier during the trigger (0: 1)
	capacity float64 // share of workers that may serve during it (0: 1)
	stall    bool    // no worker makes progress during it
}

func (tr ovlTrigger) active(t time.Duration) bool {
	return tr.dur > 0 && t >= tr.at && t < tr.at+tr.dur
}

// capacityAt is the number of calls per second the upstream can complete at
// t (0 during a stall).
func (c ovlUpstreamConfig) capacityAt(t time.Duration) float64 {
	return float64(c.workersAt(t)) / c.serviceAt(t).Seconds()
}

// workersAt is the number of workers that may be in service at t.
func (c ovlUpstreamConfig) workersAt(t time.Duration) int {
	tr := c.trigger
	if tr.active(t) {
		if tr.stall {
			return 0
		}
		if tr.capacity > 0 {
			return max(1, int(float64(c.workers)*tr.capacity))
		}
	}
	return c.workers
}

func (c ovlUpstreamConfig) serviceAt(t time.Duration) time.Duration {
	if tr := c.trigger; tr.active(t) && tr.slow > 0 {
		return time.Duration(float64(c.service) * tr.slow)
	}
	return c.service
}

// serviceEnd is when a service started at start ends: its service time from
// the start, pushed back by any overlap with a stall.
func (c ovlUpstreamConfig) serviceEnd(start time.Duration) time.Duration {
	end := start + c.serviceAt(start)
	if tr := c.trigger; tr.stall && tr.dur > 0 {
		a, b := tr.at, tr.at+tr.dur
		if start < b && end > a {
			end += b - max(a, start)
		}
	}
	return end
}

// ovlRegistry records, by attempt id, when the client stopped waiting for
// an attempt (0: it has not, or it got a response).
type ovlRegistry struct {
	next  atomic.Int64
	mu    sync.Mutex
	ended map[int64]time.Time
	sent  atomic.Int64 // attempts the client-side base sent
}

func newOVLRegistry() *ovlRegistry { return &ovlRegistry{ended: map[int64]time.Time{}} }

func (g *ovlRegistry) end(id int64, at time.Time) {
	g.mu.Lock()
	g.ended[id] = at
	g.mu.Unlock()
}

// endedBy reports whether attempt id had ended by t.
func (g *ovlRegistry) endedBy(id int64, t time.Time) bool {
	g.mu.Lock()
	at, ok := g.ended[id]
	g.mu.Unlock()
	return ok && !at.After(t)
}

// ovlBase is the client-side base RoundTripper every client of the
// experiment sends through, innermost (under every retry loop): it numbers
// each attempt in ovlAttemptHeader and tells the registry when an attempt's
// round trip ended without a response. It clones the request to set the
// header, as a RoundTripper must not change its request.
type ovlBase struct {
	base http.RoundTripper
	reg  *ovlRegistry
}

func (b ovlBase) RoundTrip(req *http.Request) (*http.Response, error) {
	id := b.reg.next.Add(1)
	r := req.Clone(req.Context())
	r.Header.Set(ovlAttemptHeader, strconv.FormatInt(id, 10))
	b.reg.sent.Add(1)
	resp, err := b.base.RoundTrip(r)
	if err != nil {
		b.reg.end(id, time.Now())
	}
	return resp, err
}

// ovlUpstream is the server. Its state is under mu; the FIFO queue holds
// the waiting requests, the head at queue[head].
type ovlUpstream struct {
	srv    *httptest.Server
	cfg    ovlUpstreamConfig
	reg    *ovlRegistry
	closed chan struct{}
	wake   *time.Timer // dispatches when workers come back after a trigger

	mu         sync.Mutex
	t0         time.Time
	inService  int
	queue      []*ovlWaiter
	head       int
	lastChange time.Duration // of the queue length, for queueArea
	win        []ovlUpWindow
	peakQueue  int
	peakHeld   int // most requests held at once, queued or in service
	served200  int // 200s written in full
	rejected   int // 503s written for a full queue (shed)
	h2Arrivals int // attempts that arrived over HTTP/2
	totals     ovlUpWindow
}

type ovlWaiter struct {
	r       *http.Request
	ready   chan struct{} // closed when a worker takes it, or it is dropped
	dropped bool
	reject  bool // shed: it holds a worker for rejectCost, then is answered 503
}

var ovlOKBody = []byte(`{"status":"ok","items":[1,2,3]}`)

func newOVLUpstream(cfg ovlUpstreamConfig, reg *ovlRegistry) *ovlUpstream {
	return newOVLUpstreamBehind(cfg, reg, nil)
}

// newOVLUpstreamBehind is newOVLUpstream with the server's handler wrap(u)
// (middleware in front of the upstream: package server's half of the
// deadline contract), or u itself when wrap is nil.
func newOVLUpstreamBehind(cfg ovlUpstreamConfig, reg *ovlRegistry, wrap func(http.Handler) http.Handler) *ovlUpstream {
	u := &ovlUpstream{
		cfg:    cfg,
		reg:    reg,
		closed: make(chan struct{}),
		win:    make([]ovlUpWindow, int(cfg.span/ovlWindow)),
	}
	var h http.Handler = u
	if wrap != nil {
		h = wrap(u)
	}
	u.srv = httptest.NewUnstartedServer(h)
	if cfg.h2 {
		u.srv.EnableHTTP2 = true
		u.srv.StartTLS()
	} else {
		u.srv.Start()
	}
	return u
}

func (u *ovlUpstream) URL() string { return u.srv.URL }

// clientTransport is a fresh client transport for the upstream: the
// loopback one, or over HTTP/2 one that trusts the server's certificate
// and attempts HTTP/2 (a custom TLS config turns it off unless forced).
func (u *ovlUpstream) clientTransport() *http.Transport {
	t := loopbackTransport()
	if u.cfg.h2 {
		t.TLSClientConfig = u.srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
		t.ForceAttemptHTTP2 = true
	}
	return t
}

// begin sets time zero and arms the dispatch at the end of the trigger
// (workers that come back take waiting requests at once).
func (u *ovlUpstream) begin(t0 time.Time) {
	u.mu.Lock()
	u.t0 = t0
	if tr := u.cfg.trigger; tr.dur > 0 && (tr.stall || tr.capacity > 0) {
		u.wake = time.AfterFunc(time.Until(t0.Add(tr.at+tr.dur)), func() {
			u.mu.Lock()
			u.dispatch(time.Since(u.t0))
			u.mu.Unlock()
		})
	}
	u.mu.Unlock()
}

// Close releases every queued request unserved, stops the server and waits
// for its handlers.
func (u *ovlUpstream) Close() {
	u.mu.Lock()
	if u.wake != nil {
		u.wake.Stop()
	}
	u.mu.Unlock()
	close(u.closed)
	u.srv.Close()
}

// window returns the window of t, or nil outside [0, span).
func (u *ovlUpstream) window(t time.Duration) *ovlUpWindow {
	if t < 0 {
		return nil
	}
	if i := int(t / ovlWindow); i < len(u.win) {
		return &u.win[i]
	}
	return nil
}

// spread adds the interval [a, b) to the windows it overlaps via add.
func (u *ovlUpstream) spread(a, b time.Duration, add func(w *ovlUpWindow, d time.Duration)) {
	for a < b {
		next := (a/ovlWindow + 1) * ovlWindow
		end := min(b, next)
		if w := u.window(a); w != nil {
			add(w, end-a)
		} else if a >= 0 {
			return
		}
		a = end
	}
}

func (u *ovlUpstream) queueLen() int { return len(u.queue) - u.head }

// queueChanged accounts the queue length held since the last change;
// called with mu held, before the length changes.
func (u *ovlUpstream) queueChanged(now time.Duration) {
	if n := u.queueLen(); n > 0 {
		u.spread(u.lastChange, now, func(w *ovlUpWindow, d time.Duration) { w.queueArea += time.Duration(n) * d })
		u.totals.queueArea += time.Duration(n) * (now - u.lastChange)
	}
	u.lastChange = now
}

// dispatch hands free workers to the head of the queue; in aware mode it
// drops the heads whose caller has gone. Called with mu held.
func (u *ovlUpstream) dispatch(now time.Duration) {
	for u.queueLen() > 0 && u.inService < u.cfg.workersAt(now) {
		u.queueChanged(now)
		w := u.queue[u.head]
		u.queue[u.head] = nil
		u.head++
		if u.head > 1024 && u.head*2 > len(u.queue) {
			u.queue = append(u.queue[:0], u.queue[u.head:]...)
			u.head = 0
		}
		if u.cfg.aware && !w.reject && w.r.Context().Err() != nil {
			w.dropped = true
			if win := u.window(now); win != nil {
				win.dropped++
			}
			u.totals.dropped++
			close(w.ready)
			continue
		}
		u.inService++
		close(w.ready)
	}
}

func (u *ovlUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.Header.Get(ovlAttemptHeader), 10, 64)
	u.mu.Lock()
	now := time.Since(u.t0)
	if win := u.window(now); win != nil {
		win.arrivals++
	}
	u.totals.arrivals++
	if r.ProtoMajor == 2 {
		u.h2Arrivals++
	}
	wt := &ovlWaiter{r: r, ready: make(chan struct{})}
	u.queueChanged(now)
	switch {
	case u.cfg.shed > 0 && u.queueLen() >= u.cfg.shed:
		wt.reject = true // refused, at the head: shedding comes before serving
		if u.head > 0 {
			u.head--
			u.queue[u.head] = wt
		} else {
			u.queue = append([]*ovlWaiter{wt}, u.queue...)
		}
	default:
		u.queue = append(u.queue, wt)
	}
	u.peakQueue = max(u.peakQueue, u.queueLen())
	// held only grows here: dispatch moves requests from the queue into
	// service, and completions and drops only lower it
	u.peakHeld = max(u.peakHeld, u.queueLen()+u.inService)
	u.dispatch(now)
	u.mu.Unlock()

	// Oblivious: the wait cannot be abandoned; only the end of the run
	// (Close) releases it.
	select {
	case <-wt.ready:
	case <-u.closed:
		return
	}
	if wt.dropped {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}

	u.mu.Lock()
	start := time.Since(u.t0)
	end := u.cfg.serviceEnd(start)
	if wt.reject {
		end = start + u.cfg.rejectCost
	}
	u.mu.Unlock()
	t := time.NewTimer(time.Until(u.t0.Add(end)))
	select {
	case <-t.C:
	case <-u.closed:
		t.Stop()
		u.mu.Lock()
		u.inService--
		u.mu.Unlock()
		return
	}

	if wt.reject {
		u.mu.Lock()
		u.inService--
		u.spread(start, end, func(w *ovlUpWindow, d time.Duration) { w.busy += d })
		u.totals.busy += end - start
		if win := u.window(end); win != nil {
			win.completions++
		}
		u.totals.completions++
		u.rejected++
		u.dispatch(time.Since(u.t0))
		u.mu.Unlock()
		if u.cfg.retryAfter != "" {
			w.Header().Set("Retry-After", u.cfg.retryAfter)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	dead := u.reg.endedBy(id, time.Now())
	u.mu.Lock()
	u.inService--
	u.spread(start, end, func(w *ovlUpWindow, d time.Duration) {
		w.busy += d
		if dead {
			w.wasted += d
		}
	})
	u.totals.busy += end - start
	if dead {
		u.totals.wasted += end - start
	}
	if win := u.window(end); win != nil {
		win.completions++
	}
	u.totals.completions++
	u.dispatch(time.Since(u.t0))
	u.mu.Unlock()

	w.Header().Set("Content-Length", strconv.Itoa(len(ovlOKBody)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(ovlOKBody); err == nil {
		u.mu.Lock()
		u.served200++
		u.mu.Unlock()
	}
}

// ovlUpRecord is what the upstream saw in a run; read it after Close.
type ovlUpRecord struct {
	win       []ovlUpWindow
	totals    ovlUpWindow // over the whole run, not only [0, span)
	peakQueue int
	peakHeld  int // most requests queued or in service at once
	served200 int
	unserved  int // still queued or in service at Close
	h2        int // attempts that arrived over HTTP/2
}

func (u *ovlUpstream) record() ovlUpRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	return ovlUpRecord{
		win:       append([]ovlUpWindow(nil), u.win...),
		totals:    u.totals,
		peakQueue: u.peakQueue,
		peakHeld:  u.peakHeld,
		served200: u.served200,
		unserved:  u.totals.arrivals - u.totals.completions - u.totals.dropped,
		h2:        u.h2Arrivals,
	}
}
