package bench

import (
	"net/http"
	"slices"
	"testing"

	"github.com/resilienthttp/resilience"
)

// BenchmarkOverhead measures the success path of each peer against the
// in-memory base, one request at a time: what a peer adds to a call whose
// upstream answers at once.
func BenchmarkOverhead(b *testing.B) {
	for _, p := range append(slices.Clone(peers), limiterOffPeer, deadlinePeer) {
		b.Run("peer="+p.name, func(b *testing.B) {
			sequential(b, mustClient(b, p, memBase{}, resilience.Options{}))
		})
	}
}

// sequential is the loop of BenchmarkOverhead and BenchmarkOverheadLayers:
// one GET at a time through c, its body read and closed.
func sequential(b *testing.B, c *http.Client) {
	req, err := http.NewRequest(http.MethodGet, "http://upstream.invalid/items", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := do(c, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOverheadParallel is BenchmarkOverhead from GOMAXPROCS goroutines
// sharing one client: it adds the cost of contention on the peer's shared
// state (permits, breaker counters).
func BenchmarkOverheadParallel(b *testing.B) {
	for _, p := range peers {
		b.Run("peer="+p.name, func(b *testing.B) {
			c := mustClient(b, p, memBase{}, resilience.Options{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, err := http.NewRequest(http.MethodGet, "http://upstream.invalid/items", nil)
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if err := do(c, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
