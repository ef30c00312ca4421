package bench

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// The herd experiment: herdClients independent service instances, each with
// its own standard handler and its own http.Transport (so its own connection
// pool, as separate processes would have), call one upstream at the same
// moment, t0. The upstream answers 503 without Retry-After for the first
// herdOutage after t0, then 200. Each instance retries up to herdMaxRetries
// times, exponential from herdDelay; the other options are the defaults
// (the breaker, per instance, never sees its MinimumThroughput of 100).
// The upstream records when every attempt arrives; the experiment runs once
// with jitter (the default) and once with Retry.NoJitter.
const (
	herdClients    = 100
	herdOutage     = 300 * time.Millisecond
	herdMaxRetries = 5
	herdDelay      = 50 * time.Millisecond
)

// herdBins are the histogram windows: 25 ms shows the shape (without jitter
// the retries land at 50, 150 and 350 ms, each in one window); 100 ms is the
// window issue 3 names, too coarse to separate a retry wave from its
// neighbours (the first wave, at 25-75 ms with jitter or 50 ms without,
// falls in the same window as the initial burst either way).
var herdBins = []time.Duration{25 * time.Millisecond, 100 * time.Millisecond}

// An arrival is one attempt as the upstream saw it.
type arrival struct {
	at      time.Duration // since t0
	attempt int           // 1 for the first, 2 for the first retry, ...
}

// herdAttempts sits under each instance's handler and numbers its attempts
// in a header, so that the upstream can tell first attempts from retries.
type herdAttempts struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    int
}

func (h *herdAttempts) RoundTrip(req *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.n++
	n := h.n
	h.mu.Unlock()
	r := req.Clone(req.Context()) // a RoundTripper must not modify req
	r.Header.Set("X-Attempt", strconv.Itoa(n))
	return h.base.RoundTrip(r)
}

// runHerd runs the experiment once and returns every attempt's arrival and
// how many instances ended with a 200.
func runHerd(tb testing.TB, noJitter bool) ([]arrival, int) {
	var (
		mu       sync.Mutex
		t0       time.Time
		arrivals []arrival
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n, err := strconv.Atoi(r.Header.Get("X-Attempt"))
		if err != nil { // warm-up: opens the connection before t0
			w.WriteHeader(http.StatusOK)
			return
		}
		mu.Lock()
		since := time.Since(t0)
		arrivals = append(arrivals, arrival{since, n})
		mu.Unlock()
		if since < herdOutage {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	clients := make([]*http.Client, herdClients)
	for i := range clients {
		base := http.DefaultTransport.(*http.Transport).Clone()
		defer base.CloseIdleConnections()
		// Warm up: each instance has a kept-alive connection at t0, as a
		// running service would, so dialling does not spread the burst.
		if err := do(&http.Client{Transport: base}, mustGet(tb, srv.URL)); err != nil {
			tb.Fatal(err)
		}
		t, err := resilience.NewTransport(&herdAttempts{base: base}, resilience.Options{
			Name:  fmt.Sprintf("instance-%d", i),
			Retry: resilience.RetryOptions{MaxRetries: herdMaxRetries, Delay: herdDelay, NoJitter: noJitter},
		})
		if err != nil {
			tb.Fatal(err)
		}
		clients[i] = &http.Client{Transport: t}
	}

	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		okMu  sync.Mutex
		ok    int
	)
	for _, c := range clients {
		req := mustGet(tb, srv.URL+"/items")
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if do(c, req) == nil {
				okMu.Lock()
				ok++
				okMu.Unlock()
			}
		}()
	}
	mu.Lock()
	t0 = time.Now()
	mu.Unlock()
	close(start)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return arrivals, ok
}

func mustGet(tb testing.TB, url string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return req
}

// herdStats summarises the arrivals for one window width.
//
// Only retries (attempt ≥ 2) count: the first attempts are the same burst
// of herdClients at t0 with or without jitter. Two burst ratios, each peak
// retries in one window over mean retries per window:
//
//   - burst (the headline): over the outage, the windows that start before
//     herdOutage, [0, herdOutage) rounded up to whole windows: the load the
//     failing upstream sees, over the same span in both runs.
//   - burst-period: over the retry period, from the window of the first
//     retry to the window of the last, inclusive (empty windows count).
//     Jitter also stretches this period (late retries of instances that
//     drew long waits), which lowers its mean as much as its peak, so this
//     ratio hardly tells the runs apart; it is reported for completeness.
type herdStats struct {
	bins         []int // all attempts per window from t0
	firstBins    []int // first attempts per window
	retries      int
	lastArrival  time.Duration
	attemptsSeen int

	outageWindows, outageRetries, outagePeak int
	outageMean, burst                        float64

	from, to                int // the retry period's first and last window
	periodPeak              int
	periodMean, burstPeriod float64
}

func summarize(arrivals []arrival, width time.Duration) herdStats {
	var s herdStats
	s.from = -1
	s.outageWindows = int((herdOutage + width - 1) / width)
	for len(s.bins) < s.outageWindows {
		s.bins = append(s.bins, 0)
		s.firstBins = append(s.firstBins, 0)
	}
	for _, a := range arrivals {
		i := int(a.at / width)
		for len(s.bins) <= i {
			s.bins = append(s.bins, 0)
			s.firstBins = append(s.firstBins, 0)
		}
		s.bins[i]++
		s.attemptsSeen++
		s.lastArrival = max(s.lastArrival, a.at)
		if a.attempt == 1 {
			s.firstBins[i]++
			continue
		}
		s.retries++
		if i < s.outageWindows {
			s.outageRetries++
		}
		if s.from < 0 || i < s.from {
			s.from = i
		}
		s.to = max(s.to, i)
	}
	retriesIn := func(i int) int { return s.bins[i] - s.firstBins[i] }
	for i := range s.outageWindows {
		s.outagePeak = max(s.outagePeak, retriesIn(i))
	}
	if s.outageRetries > 0 {
		s.outageMean = float64(s.outageRetries) / float64(s.outageWindows)
		s.burst = float64(s.outagePeak) / s.outageMean
	}
	if s.retries > 0 {
		for i := s.from; i <= s.to; i++ {
			s.periodPeak = max(s.periodPeak, retriesIn(i))
		}
		s.periodMean = float64(s.retries) / float64(s.to-s.from+1)
		s.burstPeriod = float64(s.periodPeak) / s.periodMean
	}
	return s
}

// histogram draws s as text bars, one line per window: 'o' is two first
// attempts, '#' two retries (rounded up).
func (s herdStats) histogram(width time.Duration) string {
	var b strings.Builder
	for i, n := range s.bins {
		first, retries := s.firstBins[i], n-s.firstBins[i]
		fmt.Fprintf(&b, "%5d-%-5d ms |%s%s %d", i*int(width/time.Millisecond), (i+1)*int(width/time.Millisecond),
			strings.Repeat("o", (first+1)/2), strings.Repeat("#", (retries+1)/2), n)
		if first > 0 && retries > 0 {
			fmt.Fprintf(&b, " (%d first, %d retries)", first, retries)
		} else if first > 0 {
			fmt.Fprintf(&b, " (first attempts)")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// BenchmarkHerd runs the herd experiment once with jitter and once without,
// whatever b.N (run it with -benchtime 1x), and reports per window width
// the peak retries in one window of the outage (peak-<w>), the burst ratios
// over the outage (burst-<w>) and over the retry period (burst-period-<w>),
// the attempts the upstream saw, the retries among them, when the last one
// arrived (last-ms) and how many instances got a 200 (ok). With
// BENCH_RESULTS set to a directory it also writes the histograms to
// herd.txt there.
func BenchmarkHerd(b *testing.B) {
	var report strings.Builder
	fmt.Fprintf(&report, "Herd: %d instances, each its own standard handler and transport; upstream 503 (no Retry-After) for the first %v, then 200;\n"+
		"MaxRetries %d, exponential from %v. Bars: o = 2 first attempts, # = 2 retries.\n",
		herdClients, herdOutage, herdMaxRetries, herdDelay)
	peaks := map[string]map[time.Duration]int{}
	reports := map[string]string{} // the last round's, by mode
	for _, mode := range []struct {
		name     string
		noJitter bool
	}{{"on", false}, {"off", true}} {
		b.Run("jitter="+mode.name, func(b *testing.B) {
			arrivals, ok := runHerd(b, mode.noJitter)
			peaks[mode.name] = map[time.Duration]int{}
			var text strings.Builder
			for _, w := range herdBins {
				s := summarize(arrivals, w)
				ms := strconv.Itoa(int(w / time.Millisecond))
				b.ReportMetric(float64(s.outagePeak), "peak-"+ms+"ms")
				b.ReportMetric(s.burst, "burst-"+ms+"ms")
				b.ReportMetric(s.burstPeriod, "burst-period-"+ms+"ms")
				peaks[mode.name][w] = s.outagePeak
				if w == herdBins[0] {
					b.ReportMetric(float64(s.attemptsSeen), "attempts")
					b.ReportMetric(float64(s.retries), "retries")
					b.ReportMetric(float64(s.lastArrival.Microseconds())/1000, "last-ms")
					b.ReportMetric(float64(ok), "ok")
				}
				fmt.Fprintf(&text, "\njitter=%s, %v windows: %d attempts (%d retries), %d of %d instances got a 200, last attempt at %.0f ms;\n"+
					"outage (windows 0-%d): %d retries, mean %.1f per window, peak %d, burst ratio %.2f;\n"+
					"retry period (windows %d-%d): %d retries, mean %.1f per window, peak %d, burst ratio %.2f\n%s",
					mode.name, w, s.attemptsSeen, s.retries, ok, herdClients, float64(s.lastArrival.Microseconds())/1000,
					s.outageWindows-1, s.outageRetries, s.outageMean, s.outagePeak, s.burst,
					s.from, s.to, s.retries, s.periodMean, s.periodPeak, s.burstPeriod, s.histogram(w))
			}
			reports[mode.name] = text.String()
		})
	}
	report.WriteString(reports["on"] + reports["off"])
	if on, off := peaks["on"], peaks["off"]; on != nil && off != nil {
		report.WriteString("\n")
		for _, w := range herdBins {
			fmt.Fprintf(&report, "peak retries in one %v window of the outage, no jitter / jitter: %d / %d = %.2f\n",
				w, off[w], on[w], float64(off[w])/float64(max(on[w], 1)))
		}
	}
	if dir := os.Getenv("BENCH_RESULTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "herd.txt"), []byte(report.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
