package redislimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/redislimit"
)

// Every replica of a service builds the same Limiter on the same Redis:
// together they send the vendor at most 10 calls per second.
func Example() {
	mr, _ := miniredis.Run() // your Redis; an in-memory one for the example
	defer mr.Close()
	vendor := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer vendor.Close()

	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	limit, err := redislimit.New(rdb, redislimit.Options{Rate: 10, Replicas: 4})
	if err != nil {
		panic(err)
	}
	defer limit.Close()

	h, err := resilience.NewHandler(resilience.Options{
		Name:      "vendor",
		RateLimit: resilience.RateLimitOptions{Shared: limit}, // Wait: true to wait for a permit instead
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: h.Transport(nil)}
	ok, refused := 0, 0
	for i := 0; i < 3; i++ { // one call per 100ms: the 2nd call at once is over the rate
		resp, err := client.Get(vendor.URL)
		var rle *resilience.RateLimitError
		switch {
		case err == nil:
			resp.Body.Close()
			ok++
		case errors.Is(err, resilience.ErrRateLimited) && errors.As(err, &rle):
			refused++
			if refused == 1 {
				fmt.Printf("refused by the %s rate; next permit within 100ms: %v\n", rle.Limit, rle.RetryAfter <= 100*time.Millisecond)
			}
		}
	}
	fmt.Println("sent:", ok)
	// Output:
	// refused by the shared rate; next permit within 100ms: true
	// sent: 1
}
