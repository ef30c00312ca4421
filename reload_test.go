package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 13: Handlers.Apply takes a newly loaded file: it reports the
// upstreams added, removed and changed, with the changed fields; it adds
// the new ones and keeps the removed ones running for their holders.
func TestHandlersApplyReportsWhatChanged(t *testing.T) {
	load := func(s string) Config {
		t.Helper()
		c, err := LoadConfig(strings.NewReader(s))
		require.NoError(t, err)
		return c
	}
	up := cbNewUpstream(http.StatusOK)
	defer up.Close()
	var seen sync.Map // upstream name -> configure calls
	configure := func(name string, o *Options) {
		n, _ := seen.LoadOrStore(name, new(int))
		*n.(*int)++
		o.AttemptTimeout = -1 // what a file may say, set by code
	}

	hs, err := load(`{
		"defaults": {"attemptTimeout": "1s", "retry": {"delay": "1ms"}},
		"upstreams": {
			"pricing": {"totalTimeout": "5s", "retry": {"maxRetries": 3}},
			"carrier": {"circuitBreaker": {"minimumThroughput": 10}},
			"legacy":  {}
		}
	}`).Handlers(configure)
	require.NoError(t, err)
	pricing, err := hs.Handler("pricing")
	require.NoError(t, err)
	carrier, err := hs.Handler("carrier")
	require.NoError(t, err)
	legacy, err := hs.Transport("legacy", nil)
	require.NoError(t, err)
	defer legacy.CloseIdleConnections()

	next := load(`{
		"defaults": {"attemptTimeout": "1s", "retry": {"delay": "1ms"}},
		"upstreams": {
			"pricing":  {"totalTimeout": "2s", "retry": {"maxRetries": 1, "methods": ["PUT"]}},
			"carrier":  {"circuitBreaker": {"minimumThroughput": 10}},
			"shipping": {"rateLimit": {"maxConcurrent": 5}}
		}
	}`)

	for _, bad := range []struct{ upstream, field string }{
		{"carrier", "PerHost.Enabled"},          // what the running handler cannot take
		{"shipping", "RateLimit.MaxConcurrent"}, // invalid, after the others in order
	} {
		t.Run("an invalid "+bad.upstream+" changes nothing", func(t *testing.T) {
			_, err := hs.Apply(next, func(name string, o *Options) {
				configure(name, o)
				switch {
				case name != bad.upstream:
				case name == "carrier":
					o.PerHost.Enabled = true
				default:
					o.RateLimit.MaxConcurrent = -1
				}
			})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "upstreams."+bad.upstream)
			assert.Contains(t, err.Error(), bad.field)
			assert.Equal(t, []string{"carrier", "legacy", "pricing"}, hs.Names())
			assert.Equal(t, 3, pricing.cfg.Load().Retry.MaxRetries)
			assert.Equal(t, 5*time.Second, pricing.cfg.Load().TotalTimeout)
			_, err = hs.Handler("shipping")
			assert.Error(t, err)
		})
	}

	changes, err := hs.Apply(next, configure)
	require.NoError(t, err)
	assert.Equal(t, Changes{
		Added:   []string{"shipping"},
		Removed: []string{"legacy"},
		Changed: map[string][]string{"pricing": {"totalTimeout", "retry.maxRetries", "retry.methods"}},
	}, changes)

	assert.Equal(t, []string{"carrier", "pricing", "shipping"}, hs.Names())
	h, err := hs.Handler("pricing")
	require.NoError(t, err)
	assert.Same(t, pricing, h, "a changed upstream keeps its handler")
	assert.Equal(t, 1, pricing.cfg.Load().Retry.MaxRetries)
	assert.Equal(t, 2*time.Second, pricing.cfg.Load().TotalTimeout)
	assert.Equal(t, time.Duration(-1), pricing.cfg.Load().AttemptTimeout, "configure ran for it")
	h, err = hs.Handler("carrier")
	require.NoError(t, err)
	assert.Same(t, carrier, h)
	shipping, err := hs.Handler("shipping")
	require.NoError(t, err)
	assert.Equal(t, 5, shipping.cfg.Load().RateLimit.MaxConcurrent)
	assert.Len(t, hs.All(), 3)

	_, err = hs.Handler("legacy")
	assert.ErrorContains(t, err, `no upstream "legacy"`)
	status, err := cbGet(t, legacy, up.URL)
	require.NoError(t, err, "a removed upstream's handler keeps serving its holders")
	assert.Equal(t, http.StatusOK, status)

	again, err := hs.Apply(next, configure)
	require.NoError(t, err)
	assert.Equal(t, Changes{}, again, "the same file again changes nothing")
}

// Issue 13: updates (and Apply) while calls are in flight, under -race:
// every call ends, every permit goes back to the bulkhead it came from,
// every budget claim is settled, and no goroutine is left behind.
func TestLiveConfigurationConcurrentWithCalls(t *testing.T) {
	for _, perHost := range []bool{false, true} {
		t.Run(fmt.Sprintf("perHost=%v", perHost), func(t *testing.T) {
			tick := make(chan struct{}) // an update per request at most, so that circuits have time to open
			up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				select {
				case tick <- struct{}{}:
				default:
				}
				if n%3 != 0 { // failing enough for circuits to open, and probes to close them
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				_, _ = w.Write([]byte("ok"))
			})
			variant := func(i int) Options {
				o := Options{
					Name:           "live",
					AttemptTimeout: -1,
					Retry:          quickRetry(),
					RateLimit:      RateLimitOptions{MaxConcurrent: 2 + i%3, MaxQueue: 8},
					CircuitBreaker: CircuitBreakerOptions{
						FailureRatio: 0.5 + 0.1*float64(i/4%3), MinimumThroughput: 4,
						SamplingDuration: time.Second, BreakDuration: time.Millisecond,
					},
					RetryBudget: RetryBudgetOptions{MaxTokens: float64(5 + i%7), Disabled: i%5 == 4},
					Hedging:     HedgingOptions{Enabled: i%4 == 3, Delay: time.Millisecond},
					PerHost:     PerHostOptions{Enabled: perHost, MaxHosts: 1 + i%2},
				}
				o.Retry.MaxRetries = 1 + i%3
				if i%6 == 5 {
					o.RateLimit.Disabled = true
				}
				return o
			}
			hs, err := Config{Upstreams: map[string]Options{"live": variant(0)}}.Handlers(nil)
			require.NoError(t, err)
			h, err := hs.Handler("live")
			require.NoError(t, err)
			base := http.DefaultTransport.(*http.Transport).Clone()
			defer base.CloseIdleConnections()
			tr := h.Transport(base)
			// Two authorities of the one upstream, for the per-host table.
			urls := []string{up.URL(), strings.Replace(up.URL(), "127.0.0.1", "localhost", 1)}

			// Every policies the hosts had at some point, for the permits.
			var seenMu sync.Mutex
			seen := map[*policies]bool{}
			note := func() {
				states := []*hostState{h.shared}
				if perHost {
					states = h.hosts.all()
				}
				seenMu.Lock()
				for _, s := range states {
					seen[s.policies.Load()] = true
				}
				seenMu.Unlock()
			}

			var callers, bg sync.WaitGroup
			stop := make(chan struct{})
			for g := 0; g < 4; g++ {
				callers.Add(1)
				go func() {
					defer callers.Done()
					for i := 0; i < 40; i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						_, err := cbCall(ctx, tr, urls[(g+i)%2], false)
						cancel()
						if err != nil && !errors.Is(err, ErrCircuitOpen) && !errors.Is(err, ErrRateLimited) {
							t.Errorf("call: %v", err)
						}
					}
				}()
			}
			bg.Add(2)
			go func() {
				defer bg.Done()
				for i := 1; ; i += 2 {
					select {
					case <-stop:
						return
					case <-tick:
					}
					note()
					if err := h.Update(variant(i)); err != nil {
						t.Errorf("update %d: %v", i, err)
						return
					}
					note()
					if _, err := hs.Apply(Config{Upstreams: map[string]Options{"live": variant(i + 1)}}, nil); err != nil {
						t.Errorf("apply %d: %v", i, err)
						return
					}
				}
			}()
			go func() {
				defer bg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := hs.Handler("live"); err != nil {
						t.Errorf("lookup: %v", err)
						return
					}
					_ = h.CircuitState()
				}
			}()
			callers.Wait()
			close(stop)
			bg.Wait()
			note()

			assert.Zero(t, h.budget.InFlight(), "every budget claim settled")
			require.Greater(t, len(seen), 2)
			for p := range seen {
				if p.bulkhead == nil {
					continue
				}
				for i := 0; i < p.rl.MaxConcurrent; i++ {
					require.True(t, p.bulkhead.tryAcquire(), "permit %d of %d still held", i+1, p.rl.MaxConcurrent)
				}
				assert.False(t, p.bulkhead.tryAcquire(), "more permits than MaxConcurrent")
			}
			states := []*hostState{h.shared}
			if perHost {
				states = h.hosts.all()
			}
			for _, s := range states {
				assert.Zero(t, s.queued.Load(), "calls still queued")
			}
		})
	}
}
