package bench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkFallbackOutage is an outage seen through the standard handler
// with and without the fallback layer: 1,200 GETs over 20 URLs at 400/s
// from 16 callers; the upstream answers for the first second, resets every
// connection for the next 1.5 s, and answers again for the last 0.5 s. The
// handler has the faults experiment's scaled durations; with fallback, its
// OnTransient is on, so that the calls failing before the circuit opens are
// answered too. It reports the share of calls that got a 200, fresh or
// stale, the share served stale and the oldest Age served. Run it once
// (-benchtime 1x).
func BenchmarkFallbackOutage(b *testing.B) {
	const (
		requests = 1200
		urls     = 20
		interval = time.Second / 400
		up1      = time.Second
		down     = 1500 * time.Millisecond
	)
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("fallback=%v", on), func(b *testing.B) {
			var start atomic.Int64 // unix nanos of the first request
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				since := time.Duration(time.Now().UnixNano() - start.Load())
				if since >= up1 && since < up1+down {
					panic(http.ErrAbortHandler) // the connection is reset
				}
				io.WriteString(w, okBody)
			}))
			defer srv.Close()
			base := loopbackTransport()
			defer base.CloseIdleConnections()
			t, err := resilience.NewTransport(base, resilience.Options{
				TotalTimeout:   faultTotalTimeout,
				AttemptTimeout: faultAttemptTimeout,
				Retry:          resilience.RetryOptions{MaxRetries: faultMaxRetries, Delay: faultRetryDelay, MaxDelay: faultMaxRetryDelay},
				CircuitBreaker: resilience.CircuitBreakerOptions{SamplingDuration: faultSampling, BreakDuration: faultBreak},
				Fallback:       resilience.FallbackOptions{Enabled: on, OnTransient: true},
			})
			if err != nil {
				b.Fatal(err)
			}
			c := &http.Client{Transport: t}
			var (
				ok, stale atomic.Int64
				maxAge    atomic.Int64
				begin     = time.Now()
			)
			start.Store(begin.UnixNano())
			openLoop(requests, faultConcurrency, begin, interval, func(k int64) {
				resp, err := c.Get(fmt.Sprintf("%s/items/%d", srv.URL, k%urls))
				if err != nil {
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					return
				}
				ok.Add(1)
				if resp.Header.Get("X-Resilience-Fallback") == "stale" {
					stale.Add(1)
					age, _ := strconv.ParseInt(resp.Header.Get("Age"), 10, 64)
					for {
						m := maxAge.Load()
						if age <= m || maxAge.CompareAndSwap(m, age) {
							break
						}
					}
				}
			})
			b.ReportMetric(100*float64(ok.Load())/requests, "success-%")
			b.ReportMetric(100*float64(stale.Load())/requests, "stale-%")
			b.ReportMetric(float64(maxAge.Load()), "max-age-s")
		})
	}
}
