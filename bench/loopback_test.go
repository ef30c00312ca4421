package bench

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/resilienthttp/resilience"
)

// loopbackTransport is the base for loopback benchmarks: the default
// transport with an idle pool large enough for every worker to keep its
// connection alive.
func loopbackTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 128
	t.MaxIdleConnsPerHost = 128
	return t
}

// BenchmarkLoopback measures each peer end to end against an httptest
// server on loopback that answers a small 200, with keep-alive, from 1 and
// from 16 concurrent callers sharing one client. ns/op is wall time per
// request (b.N requests in all, spread over the callers); new-conns counts
// the connections the server accepted while timed, which keep-alive keeps
// at 0.
func BenchmarkLoopback(b *testing.B) {
	var conns atomic.Int64 // connections the server accepted
	// During the warm-up, each request waits until warm of them are in
	// flight at once, so that the client opens warm connections before
	// timing: without it, a warm-up whose calls happen not to overlap
	// leaves the pool short, and the timed run dials (seen: 10 new
	// connections in one round of 6).
	var warm struct {
		sync.Mutex
		want, in int
		all      chan struct{}
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		warm.Lock()
		if all := warm.all; all != nil {
			if warm.in++; warm.in == warm.want {
				close(all)
			}
			warm.Unlock()
			<-all
		} else {
			warm.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(okBody)))
		_, _ = w.Write([]byte(okBody))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	for _, conc := range []int{1, 16} {
		for _, p := range append(slices.Clone(peers), limiterOffPeer, deadlinePeer) {
			b.Run(fmt.Sprintf("conc=%d/peer=%s", conc, p.name), func(b *testing.B) {
				base := loopbackTransport()
				defer base.CloseIdleConnections()
				c := mustClient(b, p, base, resilience.Options{})
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/items", nil)
				if err != nil {
					b.Fatal(err)
				}
				// Open the connections before timing: conc calls, all in
				// flight at once.
				warm.Lock()
				warm.want, warm.in, warm.all = conc, 0, make(chan struct{})
				warm.Unlock()
				err = concurrently(conc, conc, func() error { return do(c, req) })
				warm.Lock()
				warm.all = nil
				warm.Unlock()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				start := conns.Load()
				b.ResetTimer()
				if err := concurrently(b.N, conc, func() error { return do(c, req) }); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				// Keep-alive check: new connections opened while timed
				// (0 when every connection went back to the pool).
				b.ReportMetric(float64(conns.Load()-start), "new-conns")
			})
		}
	}
}

// concurrently calls fn n times in all from conc goroutines and returns the
// first error.
func concurrently(n, conc int, fn func() error) error {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := fn(); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
