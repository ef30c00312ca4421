package bench

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/resilienthttp/resilience"
)

// A peer builds an *http.Client that sends requests through base, configured
// as close to the standard resilience handler as the library allows. Every
// peer gets the same base in a given benchmark. README.md documents each
// configuration; keep the two in step.
type peer struct {
	name string
	// new returns the client; opts are the resilience Options for the
	// benchmark (the other peers have no knob that needs changing).
	new func(base http.RoundTripper, opts resilience.Options) (*http.Client, error)
}

var peers = []peer{
	{"bare", newBare},
	{"resilience", newResilience},
	{"failsafehttp", newFailsafe},
	{"retryablehttp", newRetryable},
}

// limiterOffPeer is the standard handler with issue 19's overload limiter
// off: beside "resilience" (the defaults, limiter on) in BenchmarkOverhead
// and BenchmarkLoopback, what the limiter costs.
var limiterOffPeer = peer{"resilience-limiter-off", func(base http.RoundTripper, o resilience.Options) (*http.Client, error) {
	o.Overload.Disabled = true
	return newResilience(base, o)
}}

// deadlinePeer is the base alone behind an http.Client whose Timeout is the
// standard handler's total timeout: each request carries a deadline, as a
// production call does and as the handler gives every call. Issue 31's
// loopback target compares the handler with it, not with a call that has
// no deadline at all.
var deadlinePeer = peer{"bare-deadline", func(base http.RoundTripper, _ resilience.Options) (*http.Client, error) {
	return &http.Client{Transport: base, Timeout: 30 * time.Second}, nil
}}

// newBare is the base alone, behind a plain http.Client.
func newBare(base http.RoundTripper, _ resilience.Options) (*http.Client, error) {
	return &http.Client{Transport: base}, nil
}

// newResilience is the standard handler: zero Options are the defaults.
func newResilience(base http.RoundTripper, opts resilience.Options) (*http.Client, error) {
	t, err := resilience.NewTransport(base, opts)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// transient is the outcome set the standard handler retries and counts as a
// breaker failure, given to the peers so that all judge outcomes alike.
var transient = resilience.IsTransient

// newFailsafe is failsafehttp with the standard handler's five policies,
// outermost first: bulkhead(1000), timeout(30s), retry (3 retries,
// exponential backoff from 2s to 30s with jitter, Retry-After honoured by
// failsafehttp's builder, which handles errors, 429 and 5xx but 501; 408 is
// added), circuit breaker (failure rate 0.1 over at least 100 executions in
// 30s, open for 5s, one successful probe closes it), timeout(10s).
func newFailsafe(base http.RoundTripper, _ resilience.Options) (*http.Client, error) {
	is408 := func(resp *http.Response, err error) bool {
		return err == nil && resp != nil && resp.StatusCode == http.StatusRequestTimeout
	}
	policies := []failsafe.Policy[*http.Response]{
		bulkhead.New[*http.Response](1000),
		timeout.New[*http.Response](30 * time.Second),
		failsafehttp.NewRetryPolicyBuilder().
			HandleIf(is408).
			WithMaxRetries(3).
			WithBackoff(2*time.Second, 30*time.Second).
			WithJitterFactor(0.5).
			Build(),
		circuitbreaker.NewBuilder[*http.Response]().
			HandleIf(transient).
			WithFailureRateThreshold(0.1, 100, 30*time.Second).
			WithDelay(5 * time.Second).
			WithSuccessThreshold(1).
			Build(),
		timeout.New[*http.Response](10 * time.Second),
	}
	return &http.Client{Transport: failsafehttp.NewRoundTripper(base, policies...)}, nil
}

// newRetryable is go-retryablehttp used through StandardClient: 3 retries,
// waits from 2s to 30s (its DefaultBackoff: exponential, no jitter,
// Retry-After honoured on 429 and 503), its DefaultRetryPolicy (errors, 429,
// 5xx but 501), no logger, and an inner http.Client with a 30s timeout. It
// has no breaker, no concurrency limit and no per-attempt timeout.
func newRetryable(base http.RoundTripper, _ resilience.Options) (*http.Client, error) {
	c := retryablehttp.NewClient()
	c.HTTPClient = &http.Client{Transport: base, Timeout: 30 * time.Second}
	c.RetryMax = 3
	c.RetryWaitMin = 2 * time.Second
	c.RetryWaitMax = 30 * time.Second
	c.Logger = nil
	return c.StandardClient(), nil
}

func mustClient(tb testing.TB, p peer, base http.RoundTripper, opts resilience.Options) *http.Client {
	tb.Helper()
	c, err := p.new(base, opts)
	if err != nil {
		tb.Fatalf("%s: %v", p.name, err)
	}
	return c
}

// okBody is the canned response body of the in-memory base.
const okBody = `{"status":"ok","items":[1,2,3],"message":"hello from the in-memory upstream"}`

// memBase is an in-memory upstream: every request gets a fresh 200 response
// with a small body, allocated per call as a real transport would.
type memBase struct{}

func (memBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close() // a RoundTripper must close the request body
	}
	return &http.Response{
		Status:        "200 OK",
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(okBody)),
		ContentLength: int64(len(okBody)),
		Request:       req,
	}, nil
}

// do sends req, reads the body to EOF and closes it.
func do(c *http.Client, req *http.Request) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// shipped returns the standard handler's options with every default filled
// in, so that the experiments that scale a default follow it when it
// changes.
func shipped() resilience.Options {
	h, _ := resilience.NewHandler(resilience.Options{}) // the defaults are valid
	return h.Options()
}
