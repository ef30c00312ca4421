package resilience_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience"
)

// An upstream that allows 2 calls per minute and says so in the IETF
// draft's RateLimit fields. The third call is not sent: it fails at once,
// and the error says when the quota resets (with RateLimitOptions.Wait it
// would wait for the reset, if that came before its deadline).
func ExampleRateLimitOptions_ignoreServerQuota() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("RateLimit-Policy", `"default";q=2;w=60`)
		w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=60`, max(0, 2-n)))
		io.WriteString(w, "ok")
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(http.DefaultTransport, resilience.Options{Name: "vendor"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}
	for i := 1; i <= 3; i++ {
		resp, err := client.Get(upstream.URL)
		var rle *resilience.RateLimitError
		switch {
		case errors.As(err, &rle):
			fmt.Printf("call %d: refused by the %s quota, next permit within a minute: %v\n",
				i, rle.Limit, rle.RetryAfter > 0 && rle.RetryAfter <= time.Minute)
		case err != nil:
			fmt.Println(err)
		default:
			resp.Body.Close()
			fmt.Printf("call %d: %d\n", i, resp.StatusCode)
		}
	}
	fmt.Println("sent:", calls.Load())
	// Output:
	// call 1: 200
	// call 2: 200
	// call 3: refused by the server quota, next permit within a minute: true
	// sent: 2
}

// An upstream with quotas per resource, as GitHub's: its search quota is
// spent, its core quota is not. The search refusal holds back only the
// search route it refused; the error names the quota and the resource, and
// errors.As reaches the upstream's answer (status and headers, no body),
// from which a client library builds its own rate-limit error, as
// go-github's CheckResponse does.
func ExampleRateLimitError() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		reset := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
		if r.URL.Path == "/search/issues" {
			w.Header().Set("X-RateLimit-Remaining", "0")
			w.Header().Set("X-RateLimit-Reset", reset)
			w.Header().Set("X-RateLimit-Resource", "search")
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("X-RateLimit-Remaining", "4999")
		w.Header().Set("X-RateLimit-Reset", reset)
		w.Header().Set("X-RateLimit-Resource", "core")
	}))
	defer upstream.Close()

	t, err := resilience.NewTransport(http.DefaultTransport, resilience.Options{Name: "github"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Transport: t}
	for _, path := range []string{"/search/issues", "/user", "/search/issues", "/user"} {
		resp, err := client.Get(upstream.URL + path)
		var rle *resilience.RateLimitError
		switch {
		case errors.As(err, &rle) && rle.Response != nil:
			answer := rle.Response // the upstream's 403, as a client library would read it
			fmt.Printf("%s: refused here: quota %s of resource %q; the server said %d, %s left\n",
				path, rle.Quota, rle.Resource, answer.StatusCode, answer.Header.Get("X-RateLimit-Remaining"))
		case err != nil:
			fmt.Println(err)
		default:
			resp.Body.Close()
			fmt.Printf("%s: %d\n", path, resp.StatusCode)
		}
	}
	fmt.Println("sent:", calls.Load())
	// Output:
	// /search/issues: 403
	// /user: 200
	// /search/issues: refused here: quota X-RateLimit of resource "search"; the server said 403, 0 left
	// /user: 200
	// sent: 3
}
