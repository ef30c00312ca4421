package otelresilience_test

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience"
)

// A call answered by the fallback layer is counted as a "fallback" event,
// with the kept response's status.
func TestFallbackCounted(t *testing.T) {
	r := newRig(t)
	up := newUpstream(t, 200)
	h, c := r.newHandler(t, resilience.Options{Name: "fb", Fallback: resilience.FallbackOptions{Enabled: true}})

	resp, err := c.Get(up.URL)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body) // read to EOF: kept
	require.NoError(t, err)
	resp.Body.Close()

	h.IsolateCircuit()
	resp, err = c.Get(up.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "stale", resp.Header.Get("X-Resilience-Fallback"))

	var fallbacks int64
	for _, p := range r.events(t) {
		if p.Attrs["resilience.event"] == "fallback" {
			assert.Equal(t, int64(200), p.Attrs["http.response.status_code"])
			fallbacks += p.Value
		}
	}
	assert.EqualValues(t, 1, fallbacks)
}
