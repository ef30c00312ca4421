package redislimit

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/resilienthttp/resilience"
)

// The success path's cost of the shared rate beside the local one: calls
// through a handler over an in-memory upstream, far under either rate, so
// that the shared rate's calls are served from the lease. bench/run.sh
// runs these against a real redis-server and reports the medians.

type okTransport struct{}

func (okTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

func benchHandler(b *testing.B, rl resilience.RateLimitOptions) {
	h, err := resilience.NewHandler(resilience.Options{Name: "bench", RateLimit: rl})
	if err != nil {
		b.Fatal(err)
	}
	tr := h.Transport(okTransport{})
	req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkRateLocal is a call under the handler's own rate limit.
func BenchmarkRateLocal(b *testing.B) {
	benchHandler(b, resilience.RateLimitOptions{RequestsPerSecond: 1e9, Burst: 1000})
}

// BenchmarkRateShared is a call under a rate shared through Redis.
func BenchmarkRateShared(b *testing.B) {
	addr := benchRedis(b)
	rdb := newBenchClient(addr)
	defer rdb.Close()
	l, err := New(rdb, Options{Rate: 1_000_000_000, Prefix: "bench:" + strings.ReplaceAll(b.Name(), "/", ":") + ":"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	benchHandler(b, resilience.RateLimitOptions{Shared: l})
}
