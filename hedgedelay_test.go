package resilience

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/internal/hedgestats"
)

// Against an upstream that is uniformly slow (every answer after 20ms,
// Delay 1ms), every call wants a hedge; MaxExtraLoad holds them to its
// share, and the refusals are reported once per call.
func TestHedgeMaxExtraLoadUniformlySlow(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging: HedgingOptions{Enabled: true, Delay: time.Millisecond, MaxExtraLoad: 0.1},
		OnEvent: rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	const calls, workers = 200, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls / workers {
				routedGet(t, tr, up.URL+"/"+string(rune('a'+w)))
			}
		}()
	}
	wg.Wait()
	hedges := len(rec.of(EventHedge))
	assert.LessOrEqual(t, hedges, calls/10+1, "at most MaxExtraLoad of the calls, plus one")
	assert.Positive(t, hedges)
	capped := rec.of(EventHedgeCapped)
	// Once per call at most: a call refused at one hedge point may be
	// granted its hedge at a later one, when other calls have made room.
	assert.LessOrEqual(t, len(capped), calls)
	assert.GreaterOrEqual(t, len(capped), calls-hedges, "every call that got no hedge says so")
}

// With DelayPercentile, the delay follows the latencies seen, within the
// floor and the ceiling; Delay applies until enough attempts were seen.
func TestHedgeDelayPercentile(t *testing.T) {
	h, err := NewHandler(Options{Hedging: HedgingOptions{Enabled: true, Delay: time.Second, DelayPercentile: 0.9, MinDelay: 5 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
	require.NoError(t, err)
	c := &call{h: h, cfg: h.cfg.Load()}
	assert.Equal(t, time.Second, c.hedgeDelay(), "too few attempts seen: Delay")
	for i := range 200 {
		h.latency.Record(time.Duration(i%100) * 100 * time.Microsecond) // 0 to 9.9ms
	}
	time.Sleep(hedgestats.LatencyRefresh) // past the cached percentile
	d := c.hedgeDelay()
	assert.GreaterOrEqual(t, d, 9*time.Millisecond)
	assert.LessOrEqual(t, d, 11*time.Millisecond)
	for range 1000 {
		h.latency.Record(time.Minute)
	}
	time.Sleep(hedgestats.LatencyRefresh) // past the cached percentile
	assert.Equal(t, 500*time.Millisecond, c.hedgeDelay(), "the ceiling")
}
