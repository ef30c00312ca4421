package redislimit

import (
	"bufio"
	"cmp"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/resilienthttp/resilience"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fleet experiment: separate processes (this test binary, re-executed)
// share one Redis limit against a counting upstream, and Redis is killed
// and started again mid-run. TestFleet runs a 6 s variant; bench/run.sh
// runs the 10 s one (REDISLIMIT_FLEET_FULL=1) and keeps its report.
const (
	childEnv     = "REDISLIMIT_FLEET_CHILD"
	fleetRate    = 200
	fleetProcs   = 4
	fleetWorkers = 8 // calls in flight per process, each waiting for its permit
)

type fleetPlan struct {
	seconds         int // the run's length
	killAt, startAt int // seconds into the run when Redis is killed, and started again; 0: never
	pace            int // calls each process starts per second, each waiting for its permit; 0: fleetWorkers calls in flight, always waiting
	rate            int // the shared limit; 0: fleetRate
}

// A fleetRun is what a run of the fleet saw.
type fleetRun struct {
	start              time.Time
	killed, restarted  time.Time
	perSec             [][]int // per process, per second of the run: calls the upstream saw
	total              []int   // per second: calls the upstream saw
	events             []childEvent
	trips, sent, calls int64 // Redis round trips, calls sent upstream, and calls started (Take asked), of all processes
}

type childEvent struct {
	child int
	kind  string
	at    time.Time
}

// runFleet runs fleetProcs processes (this test binary, re-executed) on
// srv under plan, against a counting upstream.
func runFleet(t *testing.T, srv *redisServer, plan fleetPlan) *fleetRun {
	t.Helper()
	var (
		mu       sync.Mutex
		arrivals = make([][]time.Time, fleetProcs)
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		i, _ := strconv.Atoi(r.Header.Get("X-Fleet-Child"))
		if i >= 0 && i < fleetProcs {
			mu.Lock()
			arrivals[i] = append(arrivals[i], now)
			mu.Unlock()
		}
	}))
	defer up.Close()

	bin, err := os.Executable()
	require.NoError(t, err)
	run := &fleetRun{start: time.Now().Add(1500 * time.Millisecond).Truncate(time.Millisecond)} // the processes start together, once built up
	prefix := testPrefix(t)
	var (
		evMu sync.Mutex
		wg   sync.WaitGroup
		cmds []*exec.Cmd
	)
	for i := 0; i < fleetProcs; i++ {
		cmd := exec.Command(bin, "-test.run", "^$")
		cmd.Env = append(os.Environ(), childEnv+"=1",
			"FLEET_REDIS="+srv.addr(), "FLEET_URL="+up.URL, "FLEET_PREFIX="+prefix,
			"FLEET_ID="+strconv.Itoa(i), "FLEET_START="+strconv.FormatInt(run.start.UnixNano(), 10),
			"FLEET_SECONDS="+strconv.Itoa(plan.seconds), "FLEET_PACE="+strconv.Itoa(plan.pace), "FLEET_RATE="+strconv.Itoa(cmp.Or(plan.rate, fleetRate)))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 3 && f[0] == "event":
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					evMu.Lock()
					run.events = append(run.events, childEvent{i, f[1], time.Unix(0, ns)})
					evMu.Unlock()
				case len(f) == 4 && f[0] == "stats":
					trips, _ := strconv.ParseInt(f[1], 10, 64)
					sent, _ := strconv.ParseInt(f[2], 10, 64)
					calls, _ := strconv.ParseInt(f[3], 10, 64)
					evMu.Lock()
					run.trips, run.sent, run.calls = run.trips+trips, run.sent+sent, run.calls+calls
					evMu.Unlock()
				}
			}
		}(i)
	}

	if plan.killAt > 0 {
		time.Sleep(time.Until(run.start.Add(time.Duration(plan.killAt) * time.Second))) // the plan's schedule, not a wait for an outcome
		srv.kill()
		run.killed = time.Now()
		time.Sleep(time.Until(run.start.Add(time.Duration(plan.startAt) * time.Second)))
		run.restarted = time.Now() // launched: it answers soon after, so the recovery times below are upper bounds
		srv.start()
	}
	for _, cmd := range cmds {
		assert.NoError(t, cmd.Wait(), "a child process failed")
	}
	wg.Wait()

	// Per second of the run, for every process and in all.
	run.perSec = make([][]int, fleetProcs)
	run.total = make([]int, plan.seconds)
	mu.Lock()
	defer mu.Unlock()
	for i, as := range arrivals {
		run.perSec[i] = make([]int, plan.seconds)
		for _, a := range as {
			if s := int(a.Sub(run.start) / time.Second); s >= 0 && s < plan.seconds {
				run.perSec[i][s]++
				run.total[s]++
			}
		}
	}
	return run
}

// table is the run's calls per second as a Markdown table.
func (run *fleetRun) table(report *strings.Builder, plan fleetPlan) {
	fmt.Fprintf(report, "| second | upstream | per process | Redis |\n|---:|---:|---|---|\n")
	for s := range run.total {
		var each []string
		for i := range run.perSec {
			each = append(each, strconv.Itoa(run.perSec[i][s]))
		}
		state := "up"
		switch {
		case plan.killAt == 0:
		case s >= plan.killAt && s < plan.startAt:
			state = "down"
		case s == plan.startAt:
			state = "back"
		}
		fmt.Fprintf(report, "| %d | %d | %s | %s |\n", s, run.total[s], strings.Join(each, " "), state)
	}
}

// tripsPerCall is the run's Redis round trips per call sent upstream.
func (run *fleetRun) tripsPerCall() float64 { return float64(run.trips) / float64(max(1, run.sent)) }

func TestFleet(t *testing.T) {
	plan := fleetPlan{seconds: 6, killAt: 3, startAt: 4}
	if os.Getenv("REDISLIMIT_FLEET_FULL") == "1" {
		plan = fleetPlan{seconds: 10, killAt: 4, startAt: 6}
	}
	srv := startRedis(t) // the test's own: it kills it
	run := runFleet(t, srv, plan)
	start, total, perSec := run.start, run.total, run.perSec
	share := fleetRate / fleetProcs
	var report strings.Builder
	fmt.Fprintf(&report, "%d processes x %d calls in flight, shared limit %d/s, Redis killed at %.2fs and answering again at %.2fs\n\n",
		fleetProcs, fleetWorkers, fleetRate, run.killed.Sub(start).Seconds(), run.restarted.Sub(start).Seconds())
	run.table(&report, plan)
	fmt.Fprintf(&report, "\nevents (seconds into the run):\n")
	backAlone := make(map[int]time.Duration)
	for _, e := range run.events {
		fmt.Fprintf(&report, "- process %d %s at %.3fs\n", e.child, e.kind, e.at.Sub(start).Seconds())
		if e.kind == resilience.EventSharedRateRecovered.String() {
			backAlone[e.child] = e.at.Add(fleetGrace).Sub(run.restarted)
		}
	}
	fmt.Fprintf(&report, "\nback on the shared rate alone (recovered event + grace of %v), after Redis answered:", fleetGrace)
	for i := 0; i < fleetProcs; i++ {
		fmt.Fprintf(&report, " process %d %v;", i, backAlone[i].Round(time.Millisecond))
	}
	fmt.Fprintf(&report, "\n\nRedis round trips: %d for %d calls sent (%.3f per call), outage included\n", run.trips, run.sent, run.tripsPerCall())
	t.Log("\n" + report.String())
	if path := os.Getenv("REDISLIMIT_FLEET_REPORT"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(report.String()), 0o644))
	}

	// The limit is a ceiling: over it by 5% is the limiter's failure, and
	// fails the test. Under it is the fleet's own pace as well as the
	// limiter's: on a loaded 2-core machine under -race, four processes
	// were seen to make 192 calls in a second (-4%) with Redis up,
	// so the floor here is -10%; bench/redislimit.sh reports the ±5% of
	// the experiment on a quiet machine.
	lo, hi := fleetRate*90/100, fleetRate*105/100
	for s := 1; s < plan.seconds; s++ {
		assert.LessOrEqual(t, total[s], fleetRate+share, "second %d: never more than the limit plus one share", s)
		if s < plan.killAt-0 || s > plan.startAt+1 {
			assert.True(t, total[s] >= lo && total[s] <= hi, "second %d: %d calls, want %d, at most +5%% and at least -10%%", s, total[s], fleetRate)
		}
		if s > plan.killAt && s < plan.startAt {
			for i := range perSec {
				assert.InDelta(t, share, perSec[i][s], float64(share)/10, "second %d, process %d: serving at its share while Redis is down", s, i)
			}
		}
	}
	for i := 0; i < fleetProcs; i++ {
		d, ok := backAlone[i]
		if assert.True(t, ok, "process %d went back to the shared rate", i) {
			assert.Less(t, d, 2*time.Second, "process %d back on the shared rate within 2s of Redis answering", i)
		}
	}
}

// TestFleetRoundTrips measures the Redis round trips per call sent with
// Redis up all along, for bench/redislimit.sh (REDISLIMIT_FLEET_TRIPS=1;
// skipped otherwise: it takes 3 x 6.5 s): 4 processes over their share,
// fleetWorkers calls each always waiting for a permit; 4 processes
// starting 50 calls per second each, the limit in all; and the same
// under a limit of 1000/s.
func TestFleetRoundTrips(t *testing.T) {
	if os.Getenv("REDISLIMIT_FLEET_TRIPS") != "1" {
		t.Skip("a measurement for bench/redislimit.sh: set REDISLIMIT_FLEET_TRIPS=1")
	}
	srv := startRedis(t)
	var report strings.Builder
	for _, c := range []struct {
		name string
		plan fleetPlan
	}{
		{fmt.Sprintf("%d processes over their share, %d calls each always waiting", fleetProcs, fleetWorkers), fleetPlan{seconds: 5}},
		{fmt.Sprintf("%d processes starting %d calls/s each", fleetProcs, fleetRate/fleetProcs), fleetPlan{seconds: 5, pace: fleetRate / fleetProcs}},
		{fmt.Sprintf("%d processes starting %d calls/s each", fleetProcs, fleetRate/fleetProcs), fleetPlan{seconds: 5, pace: fleetRate / fleetProcs, rate: 1000}},
	} {
		run := runFleet(t, srv, c.plan)
		fmt.Fprintf(&report, "### %s, shared limit %d/s\n\n", c.name, cmp.Or(c.plan.rate, fleetRate))
		run.table(&report, c.plan)
		fmt.Fprintf(&report, "\nRedis round trips during the run (every command and pipeline the processes' clients sent, heartbeats included): %d for %d calls sent, **%.3f per call sent** (%d calls started)\n\n",
			run.trips, run.sent, run.tripsPerCall(), run.calls)
	}
	t.Log("\n" + report.String())
	if path := os.Getenv("REDISLIMIT_FLEET_TRIPS_REPORT"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(report.String()), 0o644))
	}
}

// fleetGrace is the grace of the fleet's limiters (New's formula with the
// default Timeout).
var fleetGrace = probeMax*6/5 + defaultTimeout + 20*time.Millisecond

// fleetChild is one process of the fleet: fleetWorkers calls in flight,
// each waiting for its permit, until the run ends; or with FLEET_PACE,
// that many calls started per second, each waiting for its permit. It
// prints the shared rate's events as "event <kind> <unix nanoseconds>",
// and at the end "stats <Redis round trips> <calls sent> <calls started>"
// (round trips from the start of the run until its calls have returned).
func fleetChild() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("FLEET_REDIS")})
	defer rdb.Close()
	trips := &countRoundTrips{all: true}
	rdb.AddHook(trips)
	rate, _ := strconv.Atoi(os.Getenv("FLEET_RATE"))
	l, err := New(rdb, Options{Rate: rate, Prefix: os.Getenv("FLEET_PREFIX")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	pace, _ := strconv.Atoi(os.Getenv("FLEET_PACE"))
	var out sync.Mutex
	h, err := resilience.NewHandler(resilience.Options{
		Name:      "fleet",
		RateLimit: resilience.RateLimitOptions{Shared: l, Wait: true, MaxConcurrent: max(fleetWorkers, pace)},
		Retry:     resilience.RetryOptions{Disabled: true},
		OnEvent: func(e resilience.Event) {
			if e.Kind == resilience.EventSharedRateFallback || e.Kind == resilience.EventSharedRateRecovered {
				out.Lock()
				fmt.Printf("event %s %d\n", e.Kind, time.Now().UnixNano())
				out.Unlock()
			}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tr := h.Transport(&http.Transport{MaxIdleConnsPerHost: max(fleetWorkers, pace)})
	defer tr.CloseIdleConnections()
	startNs, _ := strconv.ParseInt(os.Getenv("FLEET_START"), 10, 64)
	secs, _ := strconv.Atoi(os.Getenv("FLEET_SECONDS"))
	start := time.Unix(0, startNs)
	end := start.Add(time.Duration(secs) * time.Second)
	var failed, sent, calls atomic.Int64
	call := func() {
		calls.Add(1)
		req, _ := http.NewRequest(http.MethodGet, os.Getenv("FLEET_URL"), nil)
		req.Header.Set("X-Fleet-Child", os.Getenv("FLEET_ID"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			failed.Add(1)
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			return
		}
		sent.Add(1)
		resp.Body.Close()
	}
	time.Sleep(time.Until(start))
	tripsBefore := trips.n.Load() // New's and the heartbeats' until the run starts are not the run's
	var wg sync.WaitGroup
	if pace > 0 {
		tick := time.NewTicker(time.Second / time.Duration(pace))
		for now := range tick.C {
			if !now.Before(end) {
				break
			}
			wg.Add(1)
			go func() { defer wg.Done(); call() }()
		}
		tick.Stop()
	} else {
		for w := 0; w < fleetWorkers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					call()
				}
			}()
		}
	}
	wg.Wait()
	fmt.Printf("stats %d %d %d\n", trips.n.Load()-tripsBefore, sent.Load(), calls.Load())
	if failed.Load() > 0 {
		return 1
	}
	return 0
}
