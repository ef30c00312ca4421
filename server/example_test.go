package server_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/resilienthttp/resilience/server"
)

// The caller's budget becomes the request's deadline; a spent one is
// refused before the handler runs, with the pushback "do not retry".
func Example() {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := r.Context().Deadline()
		fmt.Fprintln(w, "served, with a deadline:", ok)
	})
	h, err := server.New(api, server.Options{})
	if err != nil {
		log.Fatal(err) // an invalid option: the error names the field
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, budget := range []string{"250", "0"} {
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Request-Budget-Ms", budget)
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("budget %s: %d, pushback %q: %s\n", budget, resp.StatusCode,
			resp.Header.Get("Retry-Pushback-Ms"), strings.TrimSpace(string(body)))
	}
	// Output:
	// budget 250: 200, pushback "": served, with a deadline: true
	// budget 0: 503, pushback "-1": resilience: server: budget spent
}
