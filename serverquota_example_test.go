package resilience_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
