package bench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/resilienthttp/resilience"
)

// sizedBase answers every request with a 200 and body, in memory.
type sizedBase struct{ body []byte }

func (s sizedBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(s.body)),
		ContentLength: int64(len(s.body)),
		Request:       req,
	}, nil
}

// BenchmarkFallbackTee is the success path of the standard handler with the
// fallback layer off and on, by body size: on, every response read to EOF
// is copied into the store (one URL, so the store replaces one entry). The
// difference of ns/KiB between on and off is the tee's cost per KiB.
func BenchmarkFallbackTee(b *testing.B) {
	for _, kib := range []int{1, 16, 256} {
		body := bytes.Repeat([]byte("x"), kib<<10)
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("body=%dKiB/fallback=%v", kib, on), func(b *testing.B) {
				h, err := resilience.NewHandler(resilience.Options{Fallback: resilience.FallbackOptions{Enabled: on}})
				if err != nil {
					b.Fatal(err)
				}
				c := &http.Client{Transport: h.Transport(sizedBase{body})}
				req, err := http.NewRequest(http.MethodGet, "http://upstream.invalid/items", nil)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if err := do(c, req); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(kib), "ns/KiB")
			})
		}
	}
}
