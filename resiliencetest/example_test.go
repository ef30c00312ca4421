package resiliencetest_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// A scripted upstream answers 503 twice, then 200: the standard handler
// retries and the client sees the 200, after three upstream requests on one
// connection.
func Example() {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(
		resiliencetest.Fault{Status: http.StatusServiceUnavailable, RetryAfter: "0"},
		resiliencetest.Fault{Status: http.StatusServiceUnavailable, RetryAfter: "0"},
		resiliencetest.Fault{Body: []byte("ok")},
	))
	defer srv.Close()

	base := &http.Transport{}
	defer base.CloseIdleConnections()
	rt, err := resilience.NewTransport(base, resilience.Options{
		Retry: resilience.RetryOptions{Delay: time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}

	resp, err := client.Get(srv.URL())
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	fmt.Println(resp.Status, string(body))
	fmt.Println("upstream requests:", srv.Requests())
	fmt.Println("new connections:", srv.NewConnections())
	// Output:
	// 200 OK ok
	// upstream requests: 3
	// new connections: 1
}

// A Transport injects faults without a network; here, a connection reset
// and then a 429 that asks the client to come back in a second.
func ExampleNewTransport() {
	client := &http.Client{Transport: resiliencetest.NewTransport(nil, resiliencetest.Sequence(
		resiliencetest.Fault{Reset: true},
		resiliencetest.Fault{Status: http.StatusTooManyRequests, RetryAfter: "1"},
	))}

	_, err := client.Get("http://upstream.test/")
	fmt.Println(errors.Is(err, syscall.ECONNRESET))

	resp, err := client.Get("http://upstream.test/")
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Retry-After"))
	// Output:
	// true
	// 429 1
}

// A Mix draws faults at random by weight, the same ones for the same seed.
func ExampleMix() {
	script := resiliencetest.Mix(5,
		resiliencetest.Weighted{Weight: 8, Fault: resiliencetest.Fault{}},
		resiliencetest.Weighted{Weight: 1, Fault: resiliencetest.Fault{Status: http.StatusServiceUnavailable}},
		resiliencetest.Weighted{Weight: 1, Fault: resiliencetest.Fault{Reset: true}},
	)
	for range 10 {
		switch f := script.Next(); {
		case f.Reset:
			fmt.Print("reset ")
		case f.Status != 0:
			fmt.Print(f.Status, " ")
		default:
			fmt.Print("200 ")
		}
	}
	fmt.Println()
	// Output: 200 200 200 503 503 200 200 reset 200 200
}
