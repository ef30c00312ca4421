package resilience

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// healthJSON serves the health report of h as HealthHandler does and
// returns the handler's part of it, decoded as generic JSON.
func healthJSON(t *testing.T, h *Handler) map[string]any {
	t.Helper()
	rec := httptest.NewRecorder()
	HealthHandler(h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var report struct {
		Handlers map[string]map[string]any `json:"handlers"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &report), rec.Body.String())
	hh, ok := report.Handlers[h.Name()]
	require.True(t, ok, rec.Body.String())
	return hh
}

// The health report's keys name what they hold and its durations carry
// their unit: without PerHost the overload limiter is the handler's own, one
// object (it was a map keyed by "", as "overload":{"":{...}}), and with
// PerHost it is keyed by host, as the circuits are; latency is in
// milliseconds, named so (it was "latency" in nanoseconds).
func TestHealthJSONShape(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // a latency that rounds to a visible number of milliseconds
	}))
	defer upstream.Close()
	call := func(c *testClient) {
		resp, err := c.Get(upstream.URL)
		require.NoError(t, err)
		resp.Body.Close()
	}

	// Without PerHost: one object.
	c := newTestClient(t, Options{Name: "single"})
	call(c)
	st := c.tr.Handler().OverloadStats()[""]
	require.NotZero(t, st.Latency, "a success gives the limiter its first latency sample")
	hh := healthJSON(t, c.tr.Handler())
	overload, ok := hh["overload"].(map[string]any)
	require.True(t, ok, "overload is an object: %v", hh)
	assert.NotContains(t, overload, "", "no section keyed by the empty string")
	assert.NotContains(t, overload, "latency", "a duration without its unit")
	assert.Equal(t, float64(st.Limit), overload["limit"])
	assert.InDelta(t, float64(st.Latency.Round(time.Microsecond))/float64(time.Millisecond), overload["latencyMs"], 1e-9,
		"latencyMs is the smoothed latency in milliseconds: %v", overload)
	assert.NotContains(t, hh, "overloadByHost")

	// With PerHost: keyed by host, as the circuits are.
	c = newTestClient(t, Options{Name: "perhost", PerHost: PerHostOptions{Enabled: true}})
	call(c)
	hh = healthJSON(t, c.tr.Handler())
	assert.NotContains(t, hh, "overload", "no handler-wide limiter with PerHost")
	byHost, ok := hh["overloadByHost"].(map[string]any)
	require.True(t, ok, "overloadByHost is an object keyed by host: %v", hh)
	hosts, ok := hh["hosts"].(map[string]any)
	require.True(t, ok, "hosts: %v", hh)
	require.Len(t, byHost, 1)
	var key string
	for host, v := range byHost {
		key = host
		assert.Contains(t, hosts, host, "the same keys as the circuits'")
		assert.Contains(t, upstream.URL, host[len("http://"):], "the key is the upstream's authority")
		assert.Contains(t, v, "latencyMs")
	}

	// Go's own view decodes what the handler serves, unit and all: Health
	// encodes back to the same bytes.
	var report Health
	rec := httptest.NewRecorder()
	HealthHandler(c.tr.Handler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &report))
	again, err := json.Marshal(report)
	require.NoError(t, err)
	assert.JSONEq(t, rec.Body.String(), string(again))
	assert.NotZero(t, report.Handlers["perhost"].OverloadByHost[key].Latency, "latencyMs decoded")
}

// A latency in a health report that no duration holds is refused, named.
func TestOverloadStatsJSONRefusesBadLatency(t *testing.T) {
	for _, text := range []string{`{"latencyMs":-1}`, `{"latencyMs":1e300}`} {
		var st OverloadStats
		err := json.Unmarshal([]byte(text), &st)
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), "latencyMs")
	}
	var st OverloadStats
	require.NoError(t, json.Unmarshal([]byte(`{"limit":3,"latencyMs":53.217}`), &st))
	assert.Equal(t, OverloadStats{Limit: 3, Latency: 53217 * time.Microsecond}, st)
}
