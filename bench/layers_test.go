package bench

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/resilienthttp/resilience"
)

// allOff is the handler with every layer that can be switched off switched
// off: what the stack costs when it protects against nothing.
func allOff() resilience.Options {
	return resilience.Options{
		RateLimit:      resilience.RateLimitOptions{Disabled: true, IgnoreServerQuota: true},
		Overload:       resilience.OverloadOptions{Disabled: true},
		TotalTimeout:   -1,
		AttemptTimeout: -1,
		Retry:          resilience.RetryOptions{Disabled: true},
		RetryBudget:    resilience.RetryBudgetOptions{Disabled: true},
		CircuitBreaker: resilience.CircuitBreakerOptions{Disabled: true},
	}
}

// layers turn one layer of allOff back on, as it ships.
var layers = []struct {
	name string
	on   func(*resilience.Options)
}{
	{"admission", func(o *resilience.Options) { o.RateLimit.Disabled = false }},
	{"server-quota", func(o *resilience.Options) { o.RateLimit.IgnoreServerQuota = false }},
	{"overload", func(o *resilience.Options) { o.Overload.Disabled = false }},
	{"timeouts", func(o *resilience.Options) { o.TotalTimeout, o.AttemptTimeout = 0, 0 }},
	{"retry", func(o *resilience.Options) { o.Retry.Disabled = false }},
	{"retry+budget", func(o *resilience.Options) { o.Retry.Disabled, o.RetryBudget.Disabled = false, false }},
	{"breaker", func(o *resilience.Options) { o.CircuitBreaker.Disabled = false }},
}

// BenchmarkOverheadLayers is BenchmarkOverhead layer by layer: the bare
// base, the handler with every layer off ("off": what a layer that is off
// costs, together with the stack itself), each layer alone on top of that,
// and the defaults. A layer's own cost is its row minus "off".
func BenchmarkOverheadLayers(b *testing.B) {
	run := sequential
	handler := func(b *testing.B, o resilience.Options) *http.Client {
		t, err := resilience.NewTransport(memBase{}, o)
		if err != nil {
			b.Fatal(err)
		}
		return &http.Client{Transport: t}
	}
	b.Run("layer=bare", func(b *testing.B) { run(b, &http.Client{Transport: memBase{}}) })
	b.Run("layer=off", func(b *testing.B) { run(b, handler(b, allOff())) })
	for _, l := range layers {
		b.Run("layer="+l.name, func(b *testing.B) {
			o := allOff()
			l.on(&o)
			run(b, handler(b, o))
		})
	}
	b.Run("layer=defaults", func(b *testing.B) { run(b, handler(b, resilience.Options{})) })
	// Observers on the defaults: a no-op OnEvent, and a Logger at Info (it
	// drops the Debug records every call emits). Neither may cost the
	// success path an allocation (issue 29).
	b.Run("layer=defaults+onevent", func(b *testing.B) {
		run(b, handler(b, resilience.Options{OnEvent: func(resilience.Event) {}}))
	})
	b.Run("layer=defaults+logger", func(b *testing.B) {
		logger := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
		run(b, handler(b, resilience.Options{Logger: logger}))
	})
}
