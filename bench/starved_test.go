package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// Issue 47, item 8: the limiter's sluggish-upstream rule read the client's
// own CPU starvation as an upstream answering slowly, and shed retries that
// a client with the limiter off sent and had served. The upstream here is
// an in-memory base (nothing on the other side to be slow) that answers
// the first attempt of every fifth call 503 and everything else 200 at
// once; the calls' retries go without delay. Whatever the limiter sheds is
// the client's own doing.
//
// Run it by hand (it is skipped otherwise; a run takes a few seconds):
//
//	STARVED=os go test -run '^TestStarvedClient$' -v -count=1 .
//
// STARVED says how the client is starved:
//   - os: STARVED_LOAD (default 4 per core) child processes of the test
//     binary spin, each on one thread, for the whole run: the operating
//     system shares the cores among them and the client, which the Go
//     scheduler cannot see;
//   - go: the client itself runs at GOMAXPROCS 1 beside STARVED_LOAD
//     goroutines that never block (the Go scheduler's own starvation).
//
// STARVED_CALLS (default 10,000) calls are made by STARVED_CALLERS (default
// 8) goroutines, through the defaults with the limiter on, then again with
// it off, and the test reports the calls that ended shed (Report.Shed) and
// those not served. It fails if the limiter shed any.
func TestStarvedClient(t *testing.T) {
	mode := os.Getenv("STARVED")
	if mode != "os" && mode != "go" {
		t.Skip("STARVED=os or STARVED=go runs it (issue 47, item 8)")
	}
	calls := envInt(t, "STARVED_CALLS", 10000)
	callers := envInt(t, "STARVED_CALLERS", 8)
	load := envInt(t, "STARVED_LOAD", 4*runtime.NumCPU())
	if mode == "os" {
		starveOS(t, load)
	} else {
		starveGo(t, load)
	}
	time.Sleep(200 * time.Millisecond) // the load settles
	var first sync.Map                 // call index -> its first attempt was answered
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Body != nil {
			req.Body.Close()
		}
		i, _ := strconv.Atoi(strings.TrimPrefix(req.URL.Path, "/"))
		if _, seen := first.LoadOrStore(i, true); !seen && i%5 == 0 {
			return memResponse(req, http.StatusServiceUnavailable), nil
		}
		return memResponse(req, http.StatusOK), nil
	})
	for _, off := range []bool{false, true} {
		first.Clear()
		r := runStarved(t, base, "http://upstream.invalid", calls, callers, off)
		t.Logf("%s (STARVED=%s, load %d, %d callers): %d calls in %v, %d retries, %d shed, %d not served",
			r.name, mode, load, callers, calls, r.wall.Round(time.Millisecond), r.retries, r.shed, r.failed)
		if r.shed > 0 {
			t.Errorf("%s: %d of %d calls shed (first: %v)", r.name, r.shed, calls, r.firstShed)
		}
	}
}

// TestSluggishUpstreamShed is the rule's protective side, beside
// TestStarvedClient: with the client not starved, an upstream (an
// httptest server) whose answers go from 1 ms to 20 ms after the first
// quarter of the calls still has retries shed.
//
//	STARVED=sluggish go test -run '^TestSluggishUpstreamShed$' -v -count=1 .
func TestSluggishUpstreamShed(t *testing.T) {
	if os.Getenv("STARVED") != "sluggish" {
		t.Skip("STARVED=sluggish runs it (issue 47, item 8)")
	}
	calls := envInt(t, "STARVED_CALLS", 2000)
	callers := envInt(t, "STARVED_CALLERS", 8)
	var first sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		d := time.Millisecond
		if i >= calls/4 {
			d = 20 * time.Millisecond
		}
		time.Sleep(d)
		if _, seen := first.LoadOrStore(i, true); !seen && i%5 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, okBody)
	}))
	defer srv.Close()
	base := srv.Client().Transport
	for _, off := range []bool{false, true} {
		first.Clear()
		r := runStarved(t, base, srv.URL, calls, callers, off)
		t.Logf("%s (sluggish upstream, %d callers): %d calls in %v, %d retries, %d shed, %d not served",
			r.name, callers, calls, r.wall.Round(time.Millisecond), r.retries, r.shed, r.failed)
		if !off && r.shed == 0 {
			t.Errorf("%s: no retry shed", r.name)
		}
	}
}

type starvedResult struct {
	name         string
	wall         time.Duration
	retries      int64
	shed, failed int64
	firstShed    error
}

// runStarved makes calls calls to url/0, url/1... from callers goroutines
// through the defaults (retries without delay) over base, the limiter on
// or off.
func runStarved(t *testing.T, base http.RoundTripper, url string, calls, callers int, off bool) *starvedResult {
	o := resilience.Options{Name: "starved", Retry: resilience.RetryOptions{Delay: -1}}
	o.Overload.Disabled = off
	tr, err := resilience.NewTransport(base, o)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	res := &starvedResult{name: "limiter on"}
	if off {
		res.name = "limiter off"
	}
	var next, retries, shed, failed atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(calls) {
					return
				}
				var rep resilience.Report
				ctx := resilience.WithReport(context.Background(), &rep)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/%d", url, i), nil)
				resp, err := c.Do(req)
				status := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				retries.Add(int64(max(rep.Attempts-1, 0)))
				if rep.Shed {
					shed.Add(1)
					mu.Lock()
					if res.firstShed == nil {
						res.firstShed = err
						if err == nil {
							res.firstShed = fmt.Errorf("status %d after %d attempts", status, rep.Attempts)
						}
					}
					mu.Unlock()
				}
				if status != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res.wall = time.Since(start)
	res.retries, res.shed, res.failed = retries.Load(), shed.Load(), failed.Load()
	return res
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// memResponse is an in-memory response of status to req.
func memResponse(req *http.Request, status int) *http.Response {
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", status, http.StatusText(status)),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(okBody)),
		ContentLength: int64(len(okBody)),
		Request:       req,
	}
}

// starveOS starts n child processes of the test binary that spin until the
// test ends, and kills them then.
func starveOS(t *testing.T, n int) {
	var cmds []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	for range n {
		c := exec.Command(os.Args[0], "-test.run", "^TestStarvedSpinner$")
		c.Env = append(os.Environ(), "STARVED_SPINNER=1", "GOMAXPROCS=1")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
}

// starveGo runs the process at GOMAXPROCS 1 beside n goroutines that never
// block, until the test ends.
func starveGo(t *testing.T, n int) {
	prev := runtime.GOMAXPROCS(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		runtime.GOMAXPROCS(prev)
	})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spin(stop)
		}()
	}
}

// spin keeps a CPU busy until stop is closed.
func spin(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		for i := 0; i < 1e5; i++ {
		}
	}
}

// TestStarvedSpinner is starveOS's child: it spins until it is killed.
func TestStarvedSpinner(t *testing.T) {
	if os.Getenv("STARVED_SPINNER") == "" {
		t.Skip("a child process of TestStarvedClient")
	}
	spin(nil)
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: a positive integer", name, s)
	}
	return n
}
