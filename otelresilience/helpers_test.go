package otelresilience_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/otelresilience"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A rig is a Metrics on an SDK provider whose manual reader the test
// collects from.
type rig struct {
	reader *sdkmetric.ManualReader
	m      *otelresilience.Metrics
}

func newRig(t *testing.T, opts ...otelresilience.Option) *rig {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(t.Context())) })
	m, err := otelresilience.New(mp, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return &rig{reader: reader, m: m}
}

// attrs is the read-back form of an attribute set.
type attrs map[string]any

func attrsOf(s attribute.Set) attrs {
	a := attrs{}
	for _, kv := range s.ToSlice() {
		a[string(kv.Key)] = kv.Value.AsInterface()
	}
	return a
}

// A point is one data point read back: its attributes and its value (the
// sum of a counter, the value of a gauge, the count of a histogram).
type point struct {
	Attrs attrs
	Value int64
}

// collect reads every metric of the package's scope, by name.
func (r *rig) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(t.Context(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelresilience.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// points returns the points of a sum's or a gauge's data points.
func points(dps []metricdata.DataPoint[int64]) []point {
	var ps []point
	for _, dp := range dps {
		ps = append(ps, point{attrsOf(dp.Attributes), dp.Value})
	}
	return ps
}

// events returns the points of resilience.events.
func (r *rig) events(t *testing.T) []point {
	t.Helper()
	m, ok := r.collect(t)["resilience.events"]
	if !ok {
		return nil
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "resilience.events is a Sum[int64], not %T", m.Data)
	require.True(t, sum.IsMonotonic)
	require.Equal(t, "{event}", m.Unit)
	return points(sum.DataPoints)
}

// histogram returns the points of a duration histogram, each valued with
// its count, and checks that every recorded duration is plausible.
func (r *rig) histogram(t *testing.T, name string) []point {
	t.Helper()
	m, ok := r.collect(t)[name]
	if !ok {
		return nil
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a Histogram[float64], not %T", name, m.Data)
	require.Equal(t, "s", m.Unit)
	var ps []point
	for _, dp := range h.DataPoints {
		require.Greater(t, dp.Sum, 0.0, "%s: durations are positive", name)
		require.Less(t, dp.Sum, 10.0*float64(dp.Count), "%s: durations are in seconds", name)
		ps = append(ps, point{attrsOf(dp.Attributes), int64(dp.Count)})
	}
	return ps
}

// gauge returns the points of resilience.circuit.state.
func (r *rig) gauge(t *testing.T) []point {
	t.Helper()
	m, ok := r.collect(t)["resilience.circuit.state"]
	if !ok {
		return nil
	}
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok, "resilience.circuit.state is a Gauge[int64], not %T", m.Data)
	var ps []point
	for _, dp := range g.DataPoints {
		ps = append(ps, point{attrsOf(dp.Attributes), dp.Value})
	}
	return ps
}

// An upstream answers with the statuses of script in turn, then with the
// last one, and counts the requests that reach it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, script ...int) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(u.hits.Add(1))
		status := script[min(n, len(script))-1]
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "0")
		}
		w.WriteHeader(status)
		w.Write([]byte("ok")) // a body: the call holds its permit until it is closed
	}))
	t.Cleanup(u.Close)
	return u
}

// hostAttrs are the host attributes of the upstream's authority.
func (u *upstream) hostAttrs(t *testing.T) attrs {
	t.Helper()
	p, err := url.Parse(u.URL)
	require.NoError(t, err)
	port, err := strconv.Atoi(p.Port())
	require.NoError(t, err)
	return attrs{"server.address": p.Hostname(), "server.port": int64(port), "url.scheme": p.Scheme}
}

// with returns a copy of a with more attributes.
func (a attrs) with(more attrs) attrs {
	out := attrs{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// get calls url through c and closes the response body; it returns the
// status, or the error.
func get(t *testing.T, c *http.Client, url string) (int, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
