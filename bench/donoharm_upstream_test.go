package bench

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"
)

// dnhUpstream is the do-no-harm experiment's upstream: an httptest server
// on loopback that plays one scenario and records every request it
// receives. Each request draws a number (draw): the i-th attempt of call k
// (by X-Call) gets the same number for every client, so that two clients'
// retry policies meet the same fates whatever order their attempts arrive
// in; the scenario turns the draw, the arrival time and the request into an
// answer.
type dnhUpstream struct {
	srv    *httptest.Server
	sc     dnhScenario
	closed chan struct{} // closed by Close: hanging and queued requests end

	// workers holds one token per request in service (overload).
	workers chan struct{}

	mu        sync.Mutex
	rng       *rand.Rand
	start     time.Time       // the run's time zero, set by begin
	arrivals  []time.Duration // every request's arrival, since start
	seed      uint64
	perCall   map[string]int  // attempts so far, by X-Call
	inSystem  int             // requests in service or queued (overload)
	served200 int             // 200s written in full
	service   time.Duration   // the time workers were held by requests in service, in all (overload)
	services  int             // the requests that held a worker for their service
	servedAt  []time.Duration // when each 200 was written, since start
}

// dnhAction is what the upstream does with one request.
type dnhAction int

const (
	dnhOK           dnhAction = iota // 200 at once
	dnhFail                          // 503 at once, no Retry-After
	dnhHang                          // wait until the client gives up
	dnhService                       // queue for a worker, hold it, then 200
	dnhRejectCostly                  // queue for a worker, hold it for rejectCost of the service time, then 503
)

// dnhOKBody and dnhFailBody are the answers' bodies: small, as an API's.
var (
	dnhOKBody   = []byte(`{"status":"ok","items":[1,2,3]}`)
	dnhFailBody = []byte("upstream unavailable\n")
)

func newDNHUpstream(sc dnhScenario, seed uint64) *dnhUpstream {
	u := &dnhUpstream{
		sc:      sc,
		closed:  make(chan struct{}),
		rng:     rand.New(rand.NewPCG(seed, 0x5eed_d0_0a0a)),
		seed:    seed,
		perCall: map[string]int{},
	}
	if sc.overload > 0 {
		u.workers = make(chan struct{}, dnhWorkers)
	}
	u.srv = httptest.NewServer(u)
	return u
}

// begin sets the run's time zero: arrival times and the outage window count
// from it.
func (u *dnhUpstream) begin(t0 time.Time) {
	u.mu.Lock()
	u.start = t0
	u.mu.Unlock()
}

func (u *dnhUpstream) URL() string { return u.srv.URL }

// Close releases the requests that hang or wait, shuts the server down and
// waits for its handlers to return.
func (u *dnhUpstream) Close() {
	close(u.closed)
	u.srv.Close()
}

// draw returns the number of the attempt-th attempt of call (X-Call), in
// [0, 1): a function of the run's seed, the call and the attempt, so that an
// attempt's fate does not depend on how the client's other calls interleave
// with it (bench/README.md, do no harm, says what arrival order did).
// Without a call number (no call of this experiment), the next number of
// the run's sequence.
func (u *dnhUpstream) draw(call string, attempt int) float64 {
	k, err := strconv.ParseUint(call, 10, 32)
	if err != nil {
		return u.rng.Float64()
	}
	return rand.New(rand.NewPCG(u.seed, k<<20|uint64(attempt))).Float64()
}

// decide picks the answer to the attempt-th attempt of a call, which
// arrived at at, given its draw x in [0, 1). Called with u.mu held.
func (u *dnhUpstream) decide(x float64, attempt int, at time.Duration) dnhAction {
	sc := u.sc
	switch {
	case sc.blackhole:
		return dnhHang
	case sc.failFirst > 0:
		if attempt <= sc.failFirst {
			return dnhFail
		}
		return dnhOK
	case sc.overload > 0:
		if u.inSystem >= dnhWorkers+dnhQueue {
			if sc.rejectCost > 0 {
				return dnhRejectCostly // shedding takes a worker's time
			}
			return dnhFail // workers busy and queue full: shed at once
		}
		u.inSystem++
		return dnhService
	case sc.outageFor > 0 && at >= sc.outageFrom && at < sc.outageFrom+sc.outageFor:
		return dnhFail
	case x < sc.failShare:
		return dnhFail
	}
	return dnhOK
}

func (u *dnhUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	at := time.Since(u.start)
	u.arrivals = append(u.arrivals, at)
	call := r.Header.Get("X-Call")
	u.perCall[call]++
	attempt := u.perCall[call]
	act := u.decide(u.draw(call, attempt), attempt, at)
	u.mu.Unlock()

	_, _ = io.Copy(io.Discard, r.Body)
	switch act {
	case dnhHang:
		select {
		case <-r.Context().Done():
		case <-u.closed:
		}
		return
	case dnhFail:
		w.Header().Set("Content-Length", strconv.Itoa(len(dnhFailBody)))
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(dnhFailBody)
		return
	case dnhRejectCostly:
		if _, ok := u.hold(r, time.Duration(u.sc.rejectCost*float64(u.sc.serviceTime()))); !ok {
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(dnhFailBody)))
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(dnhFailBody)
		return
	case dnhService:
		ok := u.serve(r)
		u.mu.Lock()
		u.inSystem--
		u.mu.Unlock()
		if !ok {
			return
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(dnhOKBody)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(dnhOKBody); err == nil {
		u.mu.Lock()
		u.served200++
		u.servedAt = append(u.servedAt, time.Since(u.start))
		u.mu.Unlock()
	}
}

// serve waits for a worker (leaving the queue if the client gives up) and
// holds it for the scenario's service time, which a client giving up does
// not cut short: the work was started. It reports whether the request was
// served.
func (u *dnhUpstream) serve(r *http.Request) bool {
	held, ok := u.hold(r, u.sc.serviceTime())
	if held > 0 {
		u.mu.Lock()
		u.service += held
		u.services++
		u.mu.Unlock()
	}
	return ok && r.Context().Err() == nil
}

// hold waits for a worker as serve does and holds it for d; it returns how
// long it held one, and whether it held it for d. A timer fires late,
// more so on a loaded machine: a worker is held a few percent longer than
// d (bench/results/donoharm.md measures it), which is why the physical
// limit is computed from the time held (dnhResult.limit), not from d.
func (u *dnhUpstream) hold(r *http.Request, d time.Duration) (time.Duration, bool) {
	select {
	case u.workers <- struct{}{}:
	case <-r.Context().Done():
		return 0, false
	case <-u.closed:
		return 0, false
	}
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	served := true
	select {
	case <-t.C:
	case <-u.closed:
		served = false
	}
	held := time.Since(start)
	<-u.workers
	return held, served
}

// dnhRecord is what the upstream saw in a run.
type dnhRecord struct {
	attempts  int
	served200 int
	peak      int           // most arrivals in any dnhWindow
	service   time.Duration // the mean time a request in service held a worker; 0 if none did
	inSpan    int           // of the 200s, those written before the last call started (its arrivals' span)
}

// record reads the counts; call it once every call of the run has ended.
func (u *dnhUpstream) record() dnhRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	return dnhRecord{
		attempts:  len(u.arrivals),
		served200: u.served200,
		peak:      peakInWindow(u.arrivals, dnhWindow),
		service:   u.service / time.Duration(max(1, u.services)),
		inSpan:    u.servedBefore(time.Duration(u.sc.calls) * dnhInterval),
	}
}

// servedBefore counts the 200s written before t. Called with u.mu held.
func (u *dnhUpstream) servedBefore(t time.Duration) int {
	n := 0
	for _, at := range u.servedAt {
		if at < t {
			n++
		}
	}
	return n
}

// peakInWindow is the largest number of times in any half-open interval
// [t, t+window): a sliding window, not fixed buckets.
func peakInWindow(times []time.Duration, window time.Duration) int {
	ts := slices.Clone(times)
	slices.Sort(ts)
	peak, lo := 0, 0
	for hi, t := range ts {
		for t-ts[lo] >= window {
			lo++
		}
		peak = max(peak, hi-lo+1)
	}
	return peak
}
