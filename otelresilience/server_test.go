package otelresilience_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/server"
)

// Both halves of the deadline contract, counted: the server's refusal of a
// spent budget on resilience.server.refusals, and the client's pushback
// that ended its call on resilience.events.
func TestDeadlineContractCounted(t *testing.T) {
	r := newRig(t)
	api, err := server.New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a refused request reached the handler")
	}), server.Options{MinBudget: time.Hour - time.Millisecond, OnEvent: r.m.OnServerEvent})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	defer srv.Close()
	_, c := r.newHandler(t, resilience.Options{
		Name:        "pricing",
		Propagation: resilience.PropagationOptions{Enabled: true},
	})
	status, err := get(t, c, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, status, "every budget is under the floor")

	m, ok := r.collect(t)["resilience.server.refusals"]
	require.True(t, ok)
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok)
	assert.ElementsMatch(t, []point{{attrs{"resilience.server.event": "expired", "resilience.retry": false}, 1}}, points(sum.DataPoints))
	assert.Contains(t, r.events(t), point{attrs{"resilience.handler": "pricing", "http.request.method": "GET", "resilience.event": "pushback", "http.response.status_code": int64(503)}, 1})
}
