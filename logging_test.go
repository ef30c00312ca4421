package resilience

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 20: the retry budget reports each change of its state once, to
// OnEvent and Logger: exhausted at the first refusal (with why), recovered
// once half its tokens are unclaimed again; the refusals in between are
// EventBudgetExceeded.
func TestBudgetExhaustedAndRecoveredOncePerEpisode(t *testing.T) {
	var failing atomic.Bool
	up := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	rec := &evRecorder{}
	h, err := NewHandler(Options{
		Retry:          quickRetry(),
		RetryBudget:    RetryBudgetOptions{MaxTokens: 2, TokenRatio: 0.5},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		Overload:       OverloadOptions{Disabled: true},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	call := func(n int) {
		for range n {
			_, err := evGet(t, tr, up.URL(), http.MethodGet)
			require.NoError(t, err)
		}
	}
	states := func() []EventKind {
		var ks []EventKind
		for _, k := range rec.kinds() {
			if k == EventBudgetExhausted || k == EventBudgetRecovered {
				ks = append(ks, k)
			}
		}
		return ks
	}

	for episode := 1; episode <= 2; episode++ {
		failing.Store(true)
		call(20) // two failed retries empty the bucket; every other retry is refused
		failing.Store(false)
		call(1) // half a token back: not recovered
		require.Len(t, states(), 2*episode-1, "episode %d: %v", episode, states())
		call(1) // one token, half of two: recovered
		call(10)
	}
	assert.Equal(t, []EventKind{EventBudgetExhausted, EventBudgetRecovered, EventBudgetExhausted, EventBudgetRecovered}, states())
	assert.Equal(t, 40, rec.count(EventBudgetExceeded), "each refusal is still an event: 20 calls an episode")
	exhausted := rec.of(EventBudgetExhausted)[0]
	assert.ErrorIs(t, exhausted.Err, ErrBudgetExhausted)
	assert.Contains(t, exhausted.Err.Error(), "recent retries failed")
	assert.Empty(t, exhausted.Host, "the budget is the handler's")
	assert.Nil(t, exhausted.Context, "a change of state is about no one call")
}

// Every kind, the new state changes included, can be named in a
// configuration file's logLevels.
func TestConfigLogLevelsNameEveryKind(t *testing.T) {
	for k := EventRetry; k.String() != "unknown"; k++ {
		cfg, err := LoadConfig(strings.NewReader(fmt.Sprintf(`{"upstreams": {"a": {"logLevels": {%q: "INFO"}}}}`, k)))
		require.NoError(t, err, "%v", k)
		assert.Equal(t, map[EventKind]slog.Level{k: slog.LevelInfo}, cfg.Upstreams["a"].LogLevels)
	}
}
