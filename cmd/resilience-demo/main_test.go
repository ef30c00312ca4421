package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/resiliencetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// tableRow returns the fields of the named client's row of the table.
func tableRow(t *testing.T, out, name string) []string {
	t.Helper()
	_, table, ok := strings.Cut(out, "\nclient ")
	require.True(t, ok, "no table in:\n%s", out)
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	t.Fatalf("no %q row in:\n%s", name, out)
	return nil
}

// TestDemoAgainstTheEmbeddedUpstream runs the demo on the seeded mix alone:
// the outage is left out because it is timed by the clock, and a circuit
// that opens during a short outage can legitimately cost more calls than the
// bare client loses to it.
func TestDemoAgainstTheEmbeddedUpstream(t *testing.T) {
	opts := demoOptions()
	opts.TotalTimeout = 1500 * time.Millisecond // the bare client's hangs end sooner
	cfg := config{N: 150, C: 32, Rate: 150, Seed: 1, Options: opts}
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	require.NoError(t, err)
	text := out.String()
	t.Log("\n" + text)

	assert.Contains(t, text, "client     requests  success")
	bare, res := tableRow(t, text, "bare"), tableRow(t, text, "resilient")
	assert.Equal(t, "150", bare[1])
	assert.Equal(t, "150", res[1])
	assert.Regexp(t, `(?m)^summary: the standard handler served \d+\.\d% of requests against \d+\.\d% bare`, text)

	require.Len(t, rep.clients, 2)
	b, r := rep.client("bare"), rep.client("resilient")
	assert.Equal(t, 150, b.requests)
	assert.Equal(t, 150, r.requests)
	assert.Less(t, b.successRate(), 1.0, "the seeded upstream fails some bare requests")
	assert.GreaterOrEqual(t, r.successRate(), b.successRate(), "the standard handler does no worse than a bare client")
	assert.GreaterOrEqual(t, b.attempts, b.requests)
	assert.Positive(t, r.retries)
	assert.Equal(t, -1, b.retries)
	assert.Positive(t, b.newConns)
	assert.Contains(t, text, "no outage")
}

func TestDemoWithAnOutage(t *testing.T) {
	opts := demoOptions()
	opts.TotalTimeout = 1500 * time.Millisecond
	cfg := config{N: 100, C: 32, Rate: 150, Seed: 2, Outage: 300 * time.Millisecond, Options: opts}
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	assert.Contains(t, out.String(), "every request gets a 503 from 270ms to 570ms into the run")
	for _, s := range rep.clients {
		assert.Equal(t, 100, s.requests)
		assert.GreaterOrEqual(t, s.attempts, 1, s.name)
	}
	assert.Positive(t, rep.client("bare").failures["503"], "the outage fails bare requests")
	assert.Greater(t, rep.client("resilient").succeeded, rep.client("bare").succeeded,
		"retries recover the flaky upstream's failures around the outage; the budget stops them in it")
	assert.Contains(t, out.String(), "why: its ")
}

func TestDemoAgainstAURL(t *testing.T) {
	srv := resiliencetest.NewServer(nil) // a healthy "real" upstream
	defer srv.Close()
	cfg := config{URL: srv.URL(), N: 20, C: 4, Options: demoOptions()}
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "counted by the client")
	for _, s := range rep.clients {
		assert.Equal(t, 20, s.succeeded, s.name)
		assert.Equal(t, 20, s.attempts, s.name)
		assert.Positive(t, s.newConns, s.name)
	}
	assert.Equal(t, 40, srv.Requests())
}

func TestDemoRejectsBadFlags(t *testing.T) {
	for _, cfg := range []config{
		{N: 0, C: 1, Options: demoOptions()},
		{N: 1, C: 0, Options: demoOptions()},
		{N: 1, C: 1, Rate: -1, Options: demoOptions()},
	} {
		_, err := run(context.Background(), cfg, &bytes.Buffer{})
		assert.Error(t, err)
	}
}
