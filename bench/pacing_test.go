package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// The pacing experiment (issue 12, part 2): an upstream that enforces
// pacingLimit requests per fixed window of pacingWindow (the first starting
// at its first request) and says so on every response, in the IETF draft's
// fields in whole seconds (RateLimit: "default";r=N;t=S and
// RateLimit-Policy: "default";q=50;w=10), answering a request over the
// quota 429 with Retry-After (whole seconds to the window's end).
// pacingCallers goroutines share one client and make pacingCalls GETs in
// all. The quota allows them in pacingCalls/pacingLimit windows: the last
// batch can start at the beginning of the fourth window, 30 s after the
// first request.
const (
	pacingLimit   = 50
	pacingWindow  = 10 * time.Second
	pacingCallers = 8
	pacingCalls   = 200
)

type pacingUpstream struct {
	*httptest.Server
	mu        sync.Mutex
	start     time.Time
	perWindow map[int64]int
	ok        int
	over      []time.Time // when each 429 was sent
}

func newPacingUpstream() *pacingUpstream {
	u := &pacingUpstream{perWindow: map[int64]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		now := time.Now()
		if u.start.IsZero() {
			u.start = now
		}
		win := int64(now.Sub(u.start) / pacingWindow)
		u.perWindow[win]++
		used := u.perWindow[win]
		reset := int(math.Ceil(u.start.Add(time.Duration(win+1) * pacingWindow).Sub(now).Seconds()))
		over := used > pacingLimit
		if over {
			u.over = append(u.over, now)
		} else {
			u.ok++
		}
		u.mu.Unlock()
		w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, pacingLimit, int(pacingWindow.Seconds())))
		w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, max(0, pacingLimit-used), reset))
		if over {
			w.Header().Set("Retry-After", fmt.Sprint(reset))
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	return u
}

type pacingResult struct {
	wall          time.Duration
	got200        int64
	got429        int64 // calls answered 429 (after their retries, if any)
	failed        int64 // calls that ended in an error
	refused       int64 // of which ErrRateLimited
	upstream429   int   // requests the upstream answered 429
	after429      int   // of which sent after the client's first response
	windows       int64 // windows with a request in them
	lastWindowUse int   // requests in the last of them
}

func runPacing(tb testing.TB, client *http.Client) pacingResult {
	up := newPacingUpstream()
	defer up.Close()
	var r pacingResult
	var firstAnswer atomic.Pointer[time.Time]
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < pacingCallers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= pacingCalls {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, up.URL, nil)
				resp, err := client.Do(req)
				now := time.Now()
				firstAnswer.CompareAndSwap(nil, &now)
				if err != nil {
					atomic.AddInt64(&r.failed, 1)
					if errors.Is(err, resilience.ErrRateLimited) {
						atomic.AddInt64(&r.refused, 1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					atomic.AddInt64(&r.got200, 1)
				case http.StatusTooManyRequests:
					atomic.AddInt64(&r.got429, 1)
				}
			}
		}()
	}
	wg.Wait()
	r.wall = time.Since(start)
	up.mu.Lock()
	defer up.mu.Unlock()
	r.upstream429 = len(up.over)
	if first := firstAnswer.Load(); first != nil {
		for _, at := range up.over {
			if at.After(*first) {
				r.after429++
			}
		}
	}
	for w := range up.perWindow {
		r.windows = max(r.windows, w+1)
	}
	r.lastWindowUse = up.perWindow[r.windows-1]
	return r
}

// BenchmarkPacing runs the pacing experiment once per peer, whatever b.N
// (run it with -benchtime 1x): the standard handler with RateLimit.Wait
// (paced by the server's fields), the same failing fast (without Wait),
// with IgnoreServerQuota (the handler before issue 12: each call retries
// its own 429 after its Retry-After), and the bare transport. About 65 s in
// all.
func BenchmarkPacing(b *testing.B) {
	peers := []struct {
		name string
		rl   *resilience.RateLimitOptions // nil: bare
	}{
		{"resilience", &resilience.RateLimitOptions{Wait: true}},
		{"resilience-failfast", &resilience.RateLimitOptions{}},
		{"ignore-quota", &resilience.RateLimitOptions{Wait: true, IgnoreServerQuota: true}},
		{"bare", nil},
	}
	for _, p := range peers {
		b.Run("peer="+p.name, func(b *testing.B) {
			client := &http.Client{Transport: newPacingBase()}
			if p.rl != nil {
				t, err := resilience.NewTransport(newPacingBase(), resilience.Options{RateLimit: *p.rl})
				if err != nil {
					b.Fatal(err)
				}
				client.Transport = t
			}
			defer client.CloseIdleConnections()
			r := runPacing(b, client)
			b.ReportMetric(float64(r.wall.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(r.wall.Seconds(), "wall-s")
			b.ReportMetric(float64(r.windows), "windows")
			b.ReportMetric(float64(r.lastWindowUse), "last-window-reqs")
			b.ReportMetric(float64(r.got200), "got-200")
			b.ReportMetric(float64(r.got429), "got-429")
			b.ReportMetric(float64(r.failed), "failed")
			b.ReportMetric(float64(r.refused), "refused")
			b.ReportMetric(float64(r.upstream429), "upstream-429")
			b.ReportMetric(float64(r.after429), "upstream-429-after-first")
		})
	}
}

func newPacingBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = pacingCallers
	return t
}
