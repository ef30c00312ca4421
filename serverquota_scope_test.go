package resilience

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ghUpstream answers as GitHub does: the paths under /search/ count against
// the "search" resource, whose quota is spent (403, X-RateLimit-Remaining 0,
// a reset a minute ahead as a Unix time), and every other path against
// "core", which has plenty left. It counts requests per path.
type ghUpstream struct {
	*httptest.Server
	reset time.Time

	mu   sync.Mutex
	hits map[string]int
}

func ghNewUpstream() *ghUpstream {
	u := &ghUpstream{reset: time.Now().Add(time.Minute), hits: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path]++
		u.mu.Unlock()
		h := w.Header()
		h.Set("Content-Type", "application/json; charset=utf-8")
		if len(r.URL.Path) >= len("/search/") && r.URL.Path[:len("/search/")] == "/search/" {
			h.Set("X-RateLimit-Limit", "30")
			h.Set("X-RateLimit-Remaining", "0")
			h.Set("X-RateLimit-Used", "30")
			h.Set("X-RateLimit-Reset", strconv.FormatInt(u.reset.Unix(), 10))
			h.Set("X-RateLimit-Resource", "search")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"message": "API rate limit exceeded"}`)
			return
		}
		h.Set("X-RateLimit-Limit", "5000")
		h.Set("X-RateLimit-Remaining", "4999")
		h.Set("X-RateLimit-Used", "1")
		h.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
		h.Set("X-RateLimit-Resource", "core")
		_, _ = io.WriteString(w, `{}`)
	}))
	return u
}

func (u *ghUpstream) hitsOf(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

// ghGet makes one GET of path with the Authorization given ("" for none),
// and returns its status or error.
func ghGet(t *testing.T, rt http.RoundTripper, url, auth string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// Item 1: a spent quota that names its resource holds back only the calls
// known to count against it, the route the server refused, and never the
// calls to another resource.
func TestServerQuotaScopedToResource(t *testing.T) {
	up := ghNewUpstream()
	defer up.Close()
	rec := &evRecorder{}
	opts := sqOptions(rec, RateLimitOptions{})
	opts.Retry.Disabled = true
	_, tr := sqTransport(t, opts)

	status, err := ghGet(t, tr, up.URL+"/search/issues?q=a", "token one")
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, "the search quota is spent")

	for i := 0; i < 3; i++ {
		status, err = ghGet(t, tr, up.URL+"/repos/o/r", "token one")
		require.NoError(t, err, "a call to the core resource is not held back by the search quota")
		assert.Equal(t, http.StatusOK, status)
	}
	assert.Equal(t, 3, up.hitsOf("/repos/o/r"))

	// The route the server refused counts against "search": held back.
	_, err = ghGet(t, tr, up.URL+"/search/issues?q=b", "token one")
	require.ErrorIs(t, err, ErrRateLimited, "the refused route is held back until the reset")
	assert.Equal(t, 1, up.hitsOf("/search/issues"), "not sent")

	// Another search route is not known to count against it until the
	// server says so: it goes once, then it is held back too.
	status, err = ghGet(t, tr, up.URL+"/search/repositories?q=a", "token one")
	require.NoError(t, err, "a route not known to count against the spent quota goes")
	assert.Equal(t, http.StatusForbidden, status)
	_, err = ghGet(t, tr, up.URL+"/search/repositories?q=b", "token one")
	require.ErrorIs(t, err, ErrRateLimited)
	assert.Equal(t, 1, up.hitsOf("/search/repositories"))

	// Other credentials have a quota of their own.
	status, err = ghGet(t, tr, up.URL+"/search/issues?q=c", "token two")
	require.NoError(t, err, "another principal's call is not held back by the first one's quota")
	assert.Equal(t, http.StatusForbidden, status)
	assert.Equal(t, 2, up.hitsOf("/search/issues"))
	assert.Equal(t, 2, rec.count(EventRateLimited))
}

// Item 1, for the IETF draft's fields: a partition key (pk), on the
// service limit or on its policy, scopes the quota in the same way.
func TestServerQuotaScopedToPartition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"on RateLimit", http.Header{"Ratelimit": {`"peruser";r=0;t=60;pk=:dXNlcjE=:`}}},
		{"on RateLimit-Policy", http.Header{
			"Ratelimit":        {`"peruser";r=0;t=60`},
			"Ratelimit-Policy": {`"peruser";q=100;w=60;pk=:dXNlcjE=:`},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			hits := map[string]int{}
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				hits[r.URL.Path]++
				mu.Unlock()
				if r.URL.Path == "/spent" {
					for k, v := range tc.header {
						w.Header()[k] = v
					}
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.Header().Set("Ratelimit", `"peruser";r=99;t=60;pk=:dXNlcjI=:`)
			}))
			defer up.Close()
			opts := sqOptions(&evRecorder{}, RateLimitOptions{})
			opts.Retry.Disabled = true
			_, tr := sqTransport(t, opts)

			status, err := ghGet(t, tr, up.URL+"/spent", "")
			require.NoError(t, err)
			require.Equal(t, http.StatusTooManyRequests, status)
			status, err = ghGet(t, tr, up.URL+"/other", "")
			require.NoError(t, err, "a call not known to count against the partition goes")
			assert.Equal(t, http.StatusOK, status)
			_, err = ghGet(t, tr, up.URL+"/spent", "")
			require.ErrorIs(t, err, ErrRateLimited, "the refused route is held back")
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, 1, hits["/spent"])
			assert.Equal(t, 1, hits["/other"])
		})
	}
}

// What a host keeps of scoped refusals is bounded, and ended pauses make
// room; an answer with some of the quota left ends its resource's pause.
func TestScopedQuotasBounded(t *testing.T) {
	var s scopedQuotas
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	get := func(path, auth string) *http.Request {
		req, err := http.NewRequest(http.MethodGet, "https://api.example/"+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		return req
	}
	heldFor := func(req *http.Request, now time.Time) time.Duration {
		d, _ := s.held(req, now)
		return d
	}
	assert.False(t, s.maybe(t0), "nothing kept: nothing looked up")

	// Resources: at most maxScopedResources paused at once.
	for i := 0; i < maxScopedResources+8; i++ {
		s.pause(get(fmt.Sprint("r/", i), ""), fmt.Sprint("resource-", i), t0, t0.Add(time.Minute), nil)
	}
	assert.Len(t, s.resources, maxScopedResources)
	assert.Equal(t, time.Minute, heldFor(get("r/0", ""), t0))
	assert.Zero(t, heldFor(get(fmt.Sprint("r/", maxScopedResources), ""), t0), "not kept: the server decides")
	assert.Zero(t, heldFor(get("r/0", "another"), t0), "another principal's call")
	assert.Zero(t, heldFor(get("r/00", ""), t0), "another route")

	// Once they have ended, new pauses make room.
	later := t0.Add(2 * time.Minute)
	s.pause(get("late", ""), "late", later, later.Add(time.Second), nil)
	assert.Len(t, s.resources, 1)
	assert.Len(t, s.routes, 1)
	assert.Equal(t, time.Second, heldFor(get("late", ""), later))

	// Routes: at most maxScopedRoutes, none longer than maxScopedRouteBytes.
	for i := 0; i < maxScopedRoutes+8; i++ {
		s.pause(get(fmt.Sprint("late/", i), ""), "late", later, later.Add(time.Second), nil)
	}
	assert.Len(t, s.routes, maxScopedRoutes)
	long := get(strings.Repeat("p", maxScopedRouteBytes), "")
	s.lift(get("late", ""), "late")
	s.pause(long, "long", later, later.Add(time.Second), nil)
	assert.Zero(t, heldFor(long, later), "a route too long is not kept")

	// A later answer with some of the quota left ends the pause.
	assert.Zero(t, heldFor(get("late", ""), later), "lifted")
	assert.Zero(t, heldFor(get("late/1", ""), later))
}

// A sweep that frees a resource whose refusal found no room for its route
// makes no room in the routes: they stay within their bound.
func TestScopedQuotasRoutesStayBounded(t *testing.T) {
	var s scopedQuotas
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	get := func(path string) *http.Request {
		req, err := http.NewRequest(http.MethodGet, "https://api.example/"+path, nil)
		require.NoError(t, err)
		return req
	}
	for i := 0; i < maxScopedRoutes; i++ {
		s.pause(get(fmt.Sprint("a/", i)), "a", t0, t0.Add(time.Hour), nil)
	}
	s.pause(get("b"), "b", t0, t0.Add(time.Second), nil) // kept, its route not: no room
	require.Len(t, s.routes, maxScopedRoutes)
	require.Len(t, s.resources, 2)

	later := t0.Add(time.Minute) // b's pause has ended, a's runs
	s.pause(get("c"), "c", later, later.Add(time.Second), nil)
	assert.LessOrEqual(t, len(s.routes), maxScopedRoutes)
	assert.LessOrEqual(t, len(s.resources), maxScopedResources)
}
