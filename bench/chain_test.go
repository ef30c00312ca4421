package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/server"
)

// The chain experiment (issue 21): three services, front -> middle -> leaf,
// each calling the next through one kind of client, and the load generator
// calling the front through the same kind: three layers of clients, so
// that a client retrying 4 times at each layer could send 4^3 = 64 attempts
// to the leaf for one front-door call. The leaf is the overload
// experiment's shape (8 workers, 20 ms of service, 400 calls/s) offered 80%
// of that, open loop; it fails for chainOutage from chainFailAt: dead (503
// at once), or 2.5x slower (the overload experiment's slow2.5x trigger).
// Time is scaled as in the do-no-harm and overload experiments: attempt
// timeout 200 ms, total and caller deadline 2 s.
//
// Each front-door call has an id (chainCallHeader) that the front and the
// middle send on with their own call, so the leaf knows whose request it
// serves. An aware leaf checks its request's context before it starts a
// service (a Go server cancels it when its caller hangs up, and the server
// half puts the caller's budget on it); an oblivious one, as in the
// overload experiment, serves every request it queued, its caller gone or
// not. Neither cuts a service short. A service is wasted when the
// front-door call it serves had ended by the time the service did: nobody
// reads its answer.
const (
	chainWorkers     = 8
	chainServiceTime = 20 * time.Millisecond
	chainLoad        = 0.8
	chainFailAt      = 2 * time.Second
	chainOutage      = 4 * time.Second
	chainRunFor      = 10 * time.Second // arrivals stop here
	chainDeadline    = faultTotalTimeout
	chainCallHeader  = "X-Chain-Call"
	chainWindow      = 250 * time.Millisecond
)

// chainFaults are the leaf's failures, one run each.
var chainFaults = []chainFault{
	{"dead", 0, false},
	{"slow2.5x", 2.5, false},
	{"slow2.5x, oblivious leaf", 2.5, true},
}

type chainFault struct {
	name      string
	slow      float64 // 0: dead
	oblivious bool    // the leaf serves what it queued, its caller gone or not
}

// A chainVariant is what every layer runs: the client each layer calls the
// next with, and what wraps each service's handler.
type chainVariant struct {
	name, desc string
	client     func(base http.RoundTripper) (*http.Client, error)
	serve      func(http.Handler) http.Handler // nil: the handler alone
}

var chainVariants = []chainVariant{
	{"retryablehttp", "go-retryablehttp at every layer (4 attempts, waits 20-200 ms, 200 ms per attempt)", func(base http.RoundTripper) (*http.Client, error) {
		c := retryablehttp.NewClient()
		c.HTTPClient = &http.Client{Transport: base, Timeout: faultAttemptTimeout}
		c.RetryMax, c.RetryWaitMin, c.RetryWaitMax, c.Logger = faultMaxRetries, faultRetryDelay, faultMaxRetryDelay, nil
		return c.StandardClient(), nil
	}, nil},
	{"resilience", "the handler's defaults (scaled) at every layer, no contract", func(base http.RoundTripper) (*http.Client, error) {
		return chainHandler(base, false)
	}, nil},
	{"client half", "the same with Propagation on: budgets and attempt numbers sent, pushback honoured", func(base http.RoundTripper) (*http.Client, error) {
		return chainHandler(base, true)
	}, nil},
	{"both halves", "the same, and every service behind server.New with its defaults", func(base http.RoundTripper) (*http.Client, error) {
		return chainHandler(base, true)
	}, chainServer},
	// What the contract does alone: the handler's retries without the
	// budget, the breaker and the overload limiter that bound them.
	{"retries alone", "the handler's retries (scaled) without its retry budget, breaker and overload limiter", func(base http.RoundTripper) (*http.Client, error) {
		return chainHandler(base, false, chainRetriesAlone)
	}, nil},
	{"retries alone, both halves", "the same with Propagation on and every service behind server.New", func(base http.RoundTripper) (*http.Client, error) {
		return chainHandler(base, true, chainRetriesAlone)
	}, chainServer},
}

func chainServer(h http.Handler) http.Handler {
	s, err := server.New(h, server.Options{})
	if err != nil {
		panic(err) // the defaults are valid
	}
	return s
}

func chainRetriesAlone(o *resilience.Options) {
	o.RetryBudget.Disabled, o.CircuitBreaker.Disabled, o.Overload.Disabled = true, true, true
}

func chainHandler(base http.RoundTripper, propagate bool, change ...func(*resilience.Options)) (*http.Client, error) {
	o := dnhOptions()
	o.Propagation.Enabled = propagate
	for _, f := range change {
		f(&o)
	}
	t, err := resilience.NewTransport(base, o)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// chainLeaf is the leaf service.
type chainLeaf struct {
	chainFault
	t0      time.Time
	workers chan struct{}

	mu       sync.Mutex
	arrivals map[int64]int // attempts by front-door call
	services []chainService
}

type chainService struct {
	call       int64
	start, end time.Duration
}

func (l *chainLeaf) failing(t time.Duration) bool {
	return t >= chainFailAt && t < chainFailAt+chainOutage
}

func (l *chainLeaf) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.Header.Get(chainCallHeader), 10, 64)
	l.mu.Lock()
	l.arrivals[id]++
	l.mu.Unlock()
	if l.slow == 0 && l.failing(time.Since(l.t0)) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if l.oblivious {
		l.workers <- struct{}{}
	} else {
		select {
		case l.workers <- struct{}{}:
		case <-r.Context().Done():
			return // its caller left while it queued
		}
	}
	defer func() { <-l.workers }()
	if !l.oblivious && r.Context().Err() != nil {
		return
	}
	start := time.Since(l.t0)
	d := chainServiceTime
	if l.slow > 0 && l.failing(start) {
		d = time.Duration(float64(d) * l.slow)
	}
	time.Sleep(d) // a service is never cut short
	l.mu.Lock()
	l.services = append(l.services, chainService{call: id, start: start, end: time.Since(l.t0)})
	l.mu.Unlock()
	_, _ = w.Write(ovlOKBody)
}

// chainRelay is the front or the middle: it calls next with its caller's
// context and call id, and answers 200 on a 200, the status otherwise, or
// 502 on an error.
func chainRelay(next string, c *http.Client) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, next, nil)
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		req.Header.Set(chainCallHeader, r.Header.Get(chainCallHeader))
		resp, err := c.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			w.WriteHeader(resp.StatusCode)
			return
		}
		_, _ = w.Write(ovlOKBody)
	})
}

// chainCall is how one front-door call went.
type chainCall struct {
	start, end time.Duration
	ok         bool
}

type chainResult struct {
	variant  string
	calls    []chainCall
	arrivals map[int64]int
	services []chainService
}

func runChain(tb testing.TB, v chainVariant, f chainFault, seed uint64, runFor time.Duration) chainResult {
	tb.Helper()
	wrap := v.serve
	if wrap == nil {
		wrap = func(h http.Handler) http.Handler { return h }
	}
	transport := func() *http.Transport {
		return &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}
	}
	client := func() (*http.Client, *http.Transport) {
		tr := transport()
		c, err := v.client(tr)
		require.NoError(tb, err)
		return c, tr
	}
	leaf := &chainLeaf{chainFault: f, workers: make(chan struct{}, chainWorkers), arrivals: map[int64]int{}}
	leafSrv := httptest.NewServer(wrap(leaf))
	defer leafSrv.Close()
	midClient, midTr := client()
	defer midTr.CloseIdleConnections()
	midSrv := httptest.NewServer(wrap(chainRelay(leafSrv.URL+"/items", midClient)))
	defer midSrv.Close()
	frontClient, frontTr := client()
	defer frontTr.CloseIdleConnections()
	frontSrv := httptest.NewServer(wrap(chainRelay(midSrv.URL+"/items", frontClient)))
	defer frontSrv.Close()
	door, doorTr := client()
	defer doorTr.CloseIdleConnections()

	arrivals := ovlArrivals(seed, chainLoad*chainWorkers/chainServiceTime.Seconds(), runFor)
	calls := make([]chainCall, len(arrivals))
	t0 := time.Now()
	leaf.t0 = t0
	var wg sync.WaitGroup
	for k, at := range arrivals {
		time.Sleep(time.Until(t0.Add(at)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), chainDeadline)
			defer cancel()
			start := time.Since(t0)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, frontSrv.URL+"/items", nil)
			if err != nil {
				panic(err)
			}
			req.Header.Set(chainCallHeader, strconv.Itoa(k+1))
			ok := false
			if resp, err := door.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
			calls[k] = chainCall{start: start, end: time.Since(t0), ok: ok}
		}()
	}
	wg.Wait()
	leaf.mu.Lock()
	defer leaf.mu.Unlock()
	return chainResult{variant: v.name, calls: calls, arrivals: leaf.arrivals, services: leaf.services}
}

// chainSummary is what the table shows of one run.
type chainSummary struct {
	amplification float64       // leaf attempts per front-door call started during the outage
	wasted        float64       // share of the leaf's busy time on calls already ended
	served        float64       // front-door calls answered 200, all of them
	before        float64       // of those started before the fault
	outageServed  float64       // of those started during the outage
	recovery      time.Duration // from the outage's end to the first window served >= 90%; -1: never
}

func (r chainResult) summary() chainSummary {
	var s chainSummary
	var during, leafDuring, ok, okDuring, before, okBefore int
	for k, c := range r.calls {
		if c.ok {
			ok++
		}
		if c.start < chainFailAt {
			before++
			if c.ok {
				okBefore++
			}
		}
		if c.start >= chainFailAt && c.start < chainFailAt+chainOutage {
			during++
			leafDuring += r.arrivals[int64(k+1)]
			if c.ok {
				okDuring++
			}
		}
	}
	if during > 0 {
		s.amplification = float64(leafDuring) / float64(during)
		s.outageServed = float64(okDuring) / float64(during)
	}
	if len(r.calls) > 0 {
		s.served = float64(ok) / float64(len(r.calls))
	}
	if before > 0 {
		s.before = float64(okBefore) / float64(before)
	}
	var busy, wasted time.Duration
	for _, sv := range r.services {
		d := sv.end - sv.start
		busy += d
		if k := int(sv.call) - 1; k < 0 || k >= len(r.calls) || r.calls[k].end < sv.end {
			wasted += d
		}
	}
	if busy > 0 {
		s.wasted = float64(wasted) / float64(busy)
	}
	// Goodput by window of call start, from the end of the outage.
	s.recovery = -1
	end := chainFailAt + chainOutage
	for w := end; w+chainWindow <= r.lastStart(); w += chainWindow {
		n, good := 0, 0
		for _, c := range r.calls {
			if c.start >= w && c.start < w+chainWindow {
				n++
				if c.ok {
					good++
				}
			}
		}
		if n > 0 && float64(good) >= 0.9*float64(n) {
			s.recovery = w - end
			break
		}
	}
	return s
}

func (r chainResult) lastStart() time.Duration {
	if len(r.calls) == 0 {
		return 0
	}
	return r.calls[len(r.calls)-1].start
}

// BenchmarkChain runs the chain experiment once, whatever b.N (run it with
// -benchtime 1x): each fault, then each variant, for CHAIN_SEEDS seeds
// (default 2), about 11 s a run, 7 minutes in all; it writes
// results/chain.md.
func BenchmarkChain(b *testing.B) {
	seeds := 2
	if s := os.Getenv("CHAIN_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err)
		seeds = n
	}
	var out strings.Builder
	fmt.Fprintf(&out, "# The chain experiment (issue 21)\n\nfront -> middle -> leaf, each layer calling the next through the client of the row, and the load generator calling the front through it too. Leaf: %d workers, %v of service, offered %.0f%% of its %v calls/s, open loop, for %v; it fails from %v for %v. Caller deadline %v. Produced by `go test -run '^$' -bench '^BenchmarkChain$' -benchtime 1x .` in bench/ (%d seeds, each cell min-max).\n\n",
		chainWorkers, chainServiceTime, chainLoad*100, chainWorkers/chainServiceTime.Seconds(), chainRunFor, chainFailAt, chainOutage, chainDeadline, seeds)
	for _, v := range chainVariants {
		fmt.Fprintf(&out, "- **%s**: %s\n", v.name, v.desc)
	}
	for i := 0; b.Loop(); i++ {
		if i > 0 {
			continue
		}
		for _, f := range chainFaults {
			fmt.Fprintf(&out, "\n## Leaf %s for %v\n\n| client | leaf attempts per front-door call, outage | leaf busy time on calls already ended | served during the outage | served, whole run | goodput back (>= 90%% of a 250 ms window) after |\n|---|---:|---:|---:|---:|---:|\n", f.name, chainOutage)
			for _, v := range chainVariants {
				var ss []chainSummary
				for seed := range seeds {
					ss = append(ss, runChain(b, v, f, uint64(seed+1), chainRunFor).summary())
				}
				fmt.Fprintf(&out, "| %s | %s | %s | %s | %s | %s |\n", v.name,
					chainSpan(ss, func(s chainSummary) float64 { return s.amplification }, "%.2f"),
					chainSpan(ss, func(s chainSummary) float64 { return 100 * s.wasted }, "%.1f %%"),
					chainSpan(ss, func(s chainSummary) float64 { return 100 * s.outageServed }, "%.1f %%"),
					chainSpan(ss, func(s chainSummary) float64 { return 100 * s.served }, "%.1f %%"),
					chainRecovery(ss))
				b.Logf("%s, leaf %s: %+v", v.name, f.name, ss)
			}
		}
	}
	fmt.Print(out.String())
	require.NoError(b, os.WriteFile(filepath.Join("results", "chain.md"), []byte(out.String()), 0o644))
}

func chainSpan(ss []chainSummary, f func(chainSummary) float64, format string) string {
	vs := make([]float64, len(ss))
	for i, s := range ss {
		vs[i] = f(s)
	}
	sort.Float64s(vs)
	lo, hi := fmt.Sprintf(format, vs[0]), fmt.Sprintf(format, vs[len(vs)-1])
	if lo == hi {
		return lo
	}
	return lo + " – " + hi
}

func chainRecovery(ss []chainSummary) string {
	var parts []string
	for _, s := range ss {
		if s.recovery < 0 {
			parts = append(parts, "never")
		} else {
			parts = append(parts, s.recovery.String())
		}
	}
	return strings.Join(parts, ", ")
}

// TestChainSmoke runs each variant for a second before the leaf fails: the
// harness serves a healthy chain's calls, and the leaf's services are seen.
func TestChainSmoke(t *testing.T) {
	for _, v := range chainVariants {
		r := runChain(t, v, chainFaults[0], 1, chainFailAt/2)
		s := r.summary()
		assert.Greater(t, s.served, 0.9, "%s: a healthy chain serves its calls", v.name)
		assert.NotEmpty(t, r.services)
	}
}
