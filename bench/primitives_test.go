package bench

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// sinkRequest keeps the copies of op=request-copy on the heap, as an
// attempt's are.
var sinkRequest *http.Request

// sinkContext does the same for op=attempt-context's contexts.
var sinkContext context.Context

// BenchmarkPrimitives prices, one at a time, what the standard handler's
// success path is built from and cannot do without: failsafe-go's
// primitives as the handler configures them (the adaptive limiter's permit,
// the breaker's success in a time-based window, the bulkhead's permit), a
// clock read, an uncontended mutex, an attempt's own context and the copy
// of the request that carries it. Their sum is the floor under the handler's
// added time (issue 20's success-path target; bench/README.md).
func BenchmarkPrimitives(b *testing.B) {
	// A permit ended by Record, and one ended by Drop: what an attempt the
	// handler gives no latency sample pays (internal/overload, latencySamples).
	for _, end := range []struct {
		name string
		end  func(adaptivelimiter.Permit)
	}{
		{"op=adaptivelimiter", adaptivelimiter.Permit.Record},
		{"op=adaptivelimiter-unsampled", adaptivelimiter.Permit.Drop},
	} {
		b.Run(end.name, func(b *testing.B) {
			l := adaptivelimiter.NewBuilder[any]().WithLimits(8, 1000, 20).Build()
			b.ReportAllocs()
			for b.Loop() {
				p, ok := l.TryAcquirePermit()
				if !ok {
					b.Fatal("full")
				}
				end.end(p)
			}
		})
	}
	b.Run("op=breaker", func(b *testing.B) {
		cb := circuitbreaker.NewBuilder[any]().WithFailureRateThreshold(0.9, 100, 30*time.Second).
			WithDelay(time.Second).WithSuccessThreshold(1).Build()
		b.ReportAllocs()
		for b.Loop() {
			if !cb.TryAcquirePermit() {
				b.Fatal("open")
			}
			cb.RecordSuccess()
		}
	})
	b.Run("op=bulkhead", func(b *testing.B) {
		bh := bulkhead.New[any](1000)
		b.ReportAllocs()
		for b.Loop() {
			if !bh.TryAcquirePermit() {
				b.Fatal("full")
			}
			bh.ReleasePermit()
		}
	})
	b.Run("op=time.Now", func(b *testing.B) {
		for b.Loop() {
			_ = time.Now()
		}
	})
	b.Run("op=mutex", func(b *testing.B) {
		var mu sync.Mutex
		for b.Loop() {
			mu.Lock()
			//lint:ignore SA2001 the lock itself is what is priced
			mu.Unlock()
		}
	})
	b.Run("op=attempt-context", func(b *testing.B) {
		// the context an attempt under a deadline is sent on, and its end
		parent := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithCancelCause(parent)
			sinkContext = ctx
			cancel(nil)
		}
	})
	b.Run("op=request-copy", func(b *testing.B) {
		req, err := http.NewRequest(http.MethodGet, "http://upstream.invalid/items", nil)
		if err != nil {
			b.Fatal(err)
		}
		ctx := req.Context()
		b.ReportAllocs()
		for b.Loop() {
			sinkRequest = req.WithContext(ctx)
		}
	})
}
