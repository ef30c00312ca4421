package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/resilienthttp/resilience"
)

// indent lines up continuation lines under the setup's values.
const indent = "           "

// report is the outcome of a run: one stats per client, bare first.
type report struct {
	clients []*stats
	elapsed time.Duration
}

func (r *report) client(name string) *stats {
	for _, s := range r.clients {
		if s.name == name {
			return s
		}
	}
	return nil
}

// printSetup says what is about to run.
func printSetup(w io.Writer, cfg config) {
	o := cfg.Options
	if h, err := resilience.NewHandler(o); err == nil {
		o = h.Options() // the options in force: every default filled in
	}
	upstream := describeUpstream(cfg)
	if cfg.URL != "" {
		upstream = cfg.URL + " (attempts and connections are counted by the client)"
	}
	pace := "as fast as the workers go"
	if cfg.Rate > 0 {
		pace = fmt.Sprintf("started at %g/s", cfg.Rate)
	}
	if !cfg.Brief {
		fmt.Fprintln(w, "resilience-demo: a bare http.Client against the standard resilience handler")
		fmt.Fprintln(w)
	}
	if cfg.Title != "" {
		fmt.Fprintf(w, "== %s\n", cfg.Title)
	}
	fmt.Fprintf(w, "upstream   %s\n", upstream)
	fmt.Fprintf(w, "load       %d GET requests per client, %d workers, %s\n", cfg.N, cfg.C, pace)
	if cfg.Brief {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "bare       http.Client{Timeout: %v} over an http.Transport (MaxIdleConnsPerHost %d)\n", o.TotalTimeout, cfg.C)
	fmt.Fprintf(w, "resilient  resilience.NewTransport over the same kind of http.Transport:\n")
	fmt.Fprintf(w, "%sTotalTimeout %v, AttemptTimeout %v;\n", indent, o.TotalTimeout, o.AttemptTimeout)
	fmt.Fprintf(w, "%sretry GET up to %d times, %v %v backoff with jitter (max %v), honouring Retry-After;\n",
		indent, o.Retry.MaxRetries, o.Retry.Delay, o.Retry.Backoff, o.Retry.MaxDelay)
	fmt.Fprintf(w, "%scircuit opens at %.0f%% failed attempts (at least %d) in %v, for %v: a dead upstream, not a flaky one;\n",
		indent, 100*o.CircuitBreaker.FailureRatio, o.CircuitBreaker.MinimumThroughput,
		o.CircuitBreaker.SamplingDuration, o.CircuitBreaker.BreakDuration)
	fmt.Fprintf(w, "%sretry budget: %g tokens; a failed retry takes one, a successful retry puts back %g, a first success %g\n",
		indent, o.RetryBudget.MaxTokens, o.RetryBudget.RetrySuccessTokens, o.RetryBudget.TokenRatio)
	fmt.Fprintln(w)
}

// print writes the table, the failures by kind and the summary line.
func (r *report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\trequests\tsuccess\tp50\tp99\tupstream attempts\tnew conns\tcircuit openings\tretries\tbudget refusals")
	for _, s := range r.clients {
		fmt.Fprintf(tw, "%s\t%d\t%d (%.1f%%)\t%s\t%s\t%d (%.2f/req)\t%d\t%s\t%s\t%s\n",
			s.name, s.requests, s.succeeded, 100*s.successRate(), fmtDuration(s.p50), fmtDuration(s.p99),
			s.attempts, float64(s.attempts)/float64(s.requests), s.newConns, orDash(s.openings), orDash(s.retries), orDash(s.refused))
	}
	tw.Flush()
	fmt.Fprintln(w)

	for i, s := range r.clients {
		label := "failures"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(w, "%-9s  %-9s  %s\n", label, s.name, describeFailures(s.failures))
	}
	fmt.Fprintln(w)

	bare, res := r.client("bare"), r.client("resilient")
	fmt.Fprintf(w, "summary: the standard handler served %.1f%% of requests against %.1f%% bare (p99 %s vs %s) "+
		"with %.2f upstream attempts per request against %.2f; %s in all.\n",
		100*res.successRate(), 100*bare.successRate(), fmtDuration(res.p99), fmtDuration(bare.p99),
		float64(res.attempts)/float64(res.requests), float64(bare.attempts)/float64(bare.requests),
		fmt.Sprintf("%.1fs", r.elapsed.Seconds()))
	fmt.Fprintf(w, "         why: %s\n", r.why(bare, res))
	if res.p99 > bare.p99 {
		fmt.Fprintln(w, "         (a bare client's failures are fast; the handler's tail is its retries, waiting out backoff and Retry-After)")
	}
}

// why says what made the difference between the two clients.
func (r *report) why(bare, res *stats) string {
	var parts []string
	if n := res.succeeded - bare.succeeded; n > 0 {
		parts = append(parts, fmt.Sprintf("its %d retries turned failures into %d more successful calls than the bare client's", res.retries, n))
	} else if n < 0 {
		parts = append(parts, fmt.Sprintf("it served %d calls fewer than the bare client", -n))
	} else {
		parts = append(parts, "it served as many calls as the bare client")
	}
	if res.refused > 0 {
		parts = append(parts, fmt.Sprintf("the retry budget refused %d retries once retries kept failing, so a down upstream is not sent several times its load", res.refused))
	}
	if res.openings > 0 {
		parts = append(parts, fmt.Sprintf("the circuit opened %s and failed %d calls fast", times(res.openings), res.failures[circuitOpen]))
	} else {
		parts = append(parts, "the circuit stayed closed: the upstream was never down for long enough to call it dead")
	}
	return strings.Join(parts, "; ")
}

func describeFailures(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if m[kinds[i]] != m[kinds[j]] {
			return m[kinds[i]] > m[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s x%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func orDash(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

// fmtDuration rounds d to three significant figures or so.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
