package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/resiliencetest"
)

// The embedded upstream's behaviour: a seeded mix of faults, and an outage
// window during which every request gets a 503, long enough for the circuit
// breaker to open.
var (
	busyBody = bytes.Repeat([]byte("busy "), 1024/5) // a 1 KiB error page

	faultMix = []struct {
		name string
		resiliencetest.Weighted
	}{
		{"200 OK after 5ms", resiliencetest.Weighted{Weight: 93, Fault: resiliencetest.Fault{Delay: 5 * time.Millisecond, Body: []byte("ok")}}},
		{"503 with a 1 KiB body", resiliencetest.Weighted{Weight: 3, Fault: resiliencetest.Fault{Status: http.StatusServiceUnavailable, Body: busyBody}}},
		{"429 with Retry-After: 1", resiliencetest.Weighted{Weight: 1, Fault: resiliencetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"}}},
		{"hang until the client gives up", resiliencetest.Weighted{Weight: 1, Fault: resiliencetest.Fault{Hang: true}}},
		{"connection reset (TCP RST)", resiliencetest.Weighted{Weight: 2, Fault: resiliencetest.Fault{Reset: true}}},
	}

	outageFault = resiliencetest.Fault{Status: http.StatusServiceUnavailable, Body: busyBody}
)

// outageWindow is when, from the start of a client's run, the embedded
// upstream is down: for cfg.Outage from 40% of the time the requests take to
// start. A zero Outage means none.
func outageWindow(cfg config) (from, to time.Duration) {
	span := time.Second // without pacing, a guess
	if cfg.Rate > 0 {
		span = time.Duration(float64(cfg.N) / cfg.Rate * float64(time.Second))
	}
	from = span * 40 / 100
	return from, from + cfg.Outage
}

// upstreamScript is the embedded upstream's script, for a run starting now.
// Outside the outage it plays the seeded mix, so that both clients get the
// same faults in the same order of arrival.
func upstreamScript(cfg config) *resiliencetest.Script {
	choices := make([]resiliencetest.Weighted, len(faultMix))
	for i, c := range faultMix {
		choices[i] = c.Weighted
	}
	mix := resiliencetest.Mix(cfg.Seed, choices...)
	from, to := outageWindow(cfg)
	start := time.Now()
	return resiliencetest.Func(func(int) resiliencetest.Fault {
		if d := time.Since(start); d >= from && d < to {
			return outageFault
		}
		return mix.Next()
	})
}

// describeUpstream says in a few lines what the embedded upstream does.
func describeUpstream(cfg config) string {
	total := 0.0
	for _, c := range faultMix {
		total += c.Weight
	}
	parts := make([]string, len(faultMix))
	for i, c := range faultMix {
		parts[i] = fmt.Sprintf("%.0f%% %s", 100*c.Weight/total, c.name)
	}
	outage := "no outage"
	if from, to := outageWindow(cfg); to > from {
		outage = fmt.Sprintf("and an outage: every request gets a 503 from %v to %v into the run",
			from.Round(10*time.Millisecond), to.Round(10*time.Millisecond))
	}
	return fmt.Sprintf("embedded resiliencetest.Server on loopback, seed %d, each request:\n%s%s,\n%s%s;\n%s%s",
		cfg.Seed, indent, strings.Join(parts[:3], ", "), indent, strings.Join(parts[3:], ", "), indent, outage)
}
