package resilience

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pastIdle is longer than the IdleTimeout of 1ms the tests below set: a host
// idle before such a sleep is idle for longer after it, whatever the
// scheduling.
const pastIdle = 5 * time.Millisecond

func perHostTable(t *testing.T, o PerHostOptions) *hostTable {
	t.Helper()
	o.Enabled = true
	h, err := NewHandler(Options{PerHost: o})
	require.NoError(t, err)
	return h.hosts
}

// visit makes one call to rawURL's host that ends at once.
func visit(t *testing.T, tbl *hostTable, rawURL string) *hostState {
	t.Helper()
	s := tbl.get(mustURL(t, rawURL))
	tbl.release(s)
	return s
}

// tableHosts lists the authorities tbl keeps, sorted.
func tableHosts(tbl *hostTable) []string {
	var hosts []string
	for _, s := range tbl.all() {
		hosts = append(hosts, s.host)
	}
	sort.Strings(hosts)
	return hosts
}

// A call's response body held open keeps its host in use past IdleTimeout:
// the host is not forgotten, and its concurrency limit still counts the call.
func TestHostTableKeepsHostWithOpenBody(t *testing.T) {
	a := cbNewUpstream(http.StatusOK)
	defer a.Close()
	b := cbNewUpstream(http.StatusOK)
	defer b.Close()
	h, err := NewHandler(Options{
		Retry:     RetryOptions{Disabled: true},
		RateLimit: RateLimitOptions{MaxConcurrent: 1},
		PerHost:   PerHostOptions{Enabled: true, IdleTimeout: time.Millisecond},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	req, err := http.NewRequest(http.MethodGet, a.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()

	time.Sleep(pastIdle)
	_, err = cbGet(t, tr, b.URL) // a new host: the table forgets its idle hosts
	require.NoError(t, err)
	_, err = cbGet(t, tr, a.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the open body still holds a's only permit")
	assert.EqualValues(t, 1, a.hits.Load(), "the second call never reached a")

	require.NoError(t, resp.Body.Close())
	status, err := cbGet(t, tr, a.URL)
	require.NoError(t, err, "the permit came back with the body")
	assert.Equal(t, http.StatusOK, status)

	time.Sleep(pastIdle)
	visit(t, h.hosts, "http://another.test")
	assert.NotContains(t, h.HostCircuitStates(), keyOf(mustURL(t, a.URL)).String(),
		"every call to a has ended, the refused one too: a was idle, and is forgotten")
}

// A host whose circuit is open is not evicted to make room for new hosts,
// nor forgotten when idle: its calls are still refused.
func TestHostTableKeepsOpenCircuit(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts PerHostOptions
	}{
		{"evicted", PerHostOptions{Enabled: true, MaxHosts: 2, IdleTimeout: time.Hour}},
		{"idle", PerHostOptions{Enabled: true, IdleTimeout: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := cbNewUpstream(http.StatusServiceUnavailable)
			defer a.Close()
			b := cbNewUpstream(http.StatusOK)
			defer b.Close()
			c := cbNewUpstream(http.StatusOK)
			defer c.Close()
			o := cbOptions(&evRecorder{}, cbLongBreak)
			o.PerHost = tc.opts
			h, err := NewHandler(o)
			require.NoError(t, err)
			tr := h.Transport(&http.Transport{})
			defer tr.CloseIdleConnections()

			cbTrip(t, tr, a, 4)
			time.Sleep(pastIdle)
			for _, u := range []*cbUpstream{b, c} { // with MaxHosts 2, c makes room
				_, err := cbGet(t, tr, u.URL)
				require.NoError(t, err)
			}
			_, err = cbGet(t, tr, a.URL)
			require.ErrorIs(t, err, ErrCircuitOpen, "a's circuit is open for another minute")
			assert.EqualValues(t, 4, a.hits.Load(), "the refused call never reached a")
			assert.Equal(t, CircuitOpen, h.HostCircuitStates()[keyOf(mustURL(t, a.URL)).String()])
		})
	}
}

// Once its BreakDuration is over, a circuit holds its host no longer: the
// next call would be the probe anyway. The host, set aside while its circuit
// was open, is again the least recently used, and makes room first.
func TestHostTableForgetsCircuitAfterBreak(t *testing.T) {
	a := cbNewUpstream(http.StatusServiceUnavailable)
	defer a.Close()
	b := cbNewUpstream(http.StatusOK)
	defer b.Close()
	c := cbNewUpstream(http.StatusOK)
	defer c.Close()
	o := cbOptions(&evRecorder{}, cbShortBreak)
	o.PerHost = PerHostOptions{Enabled: true, MaxHosts: 2, IdleTimeout: time.Hour}
	h, err := NewHandler(o)
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	aKey, bKey, cKey := keyOf(mustURL(t, a.URL)).String(), keyOf(mustURL(t, b.URL)).String(), keyOf(mustURL(t, c.URL)).String()

	cbTrip(t, tr, a, 4)
	for _, u := range []*cbUpstream{b, c} {
		_, err := cbGet(t, tr, u.URL)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]CircuitState{aKey: CircuitOpen, cKey: CircuitClosed}, h.HostCircuitStates(),
		"b made room: a's circuit is open")
	require.Eventually(t, func() bool { return h.HostCircuitStates()[aKey] == CircuitHalfOpen },
		5*time.Second, 2*time.Millisecond, "a's break never ended")
	_, err = cbGet(t, tr, b.URL)
	require.NoError(t, err)
	assert.Equal(t, map[string]CircuitState{bKey: CircuitClosed, cKey: CircuitClosed}, h.HostCircuitStates(),
		"a, used before c, made room")
}

// A host with a call in flight is not evicted to make room for new hosts,
// though it is the one used longest ago.
func TestHostTableKeepsHostInFlight(t *testing.T) {
	a := cbNewUpstream(http.StatusOK)
	defer a.Close()
	defer a.unblock()
	b := cbNewUpstream(http.StatusOK)
	defer b.Close()
	c := cbNewUpstream(http.StatusOK)
	defer c.Close()
	h, err := NewHandler(Options{
		Retry:     RetryOptions{Disabled: true},
		RateLimit: RateLimitOptions{MaxConcurrent: 1},
		PerHost:   PerHostOptions{Enabled: true, MaxHosts: 2, IdleTimeout: time.Hour},
	})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()

	done := make(chan error, 1)
	go func() {
		_, err := cbCall(context.Background(), tr, a.URL, true)
		done <- err
	}()
	a.waitArrived(t)
	for _, u := range []*cbUpstream{b, c} { // c makes room: b goes, not a
		_, err := cbGet(t, tr, u.URL)
		require.NoError(t, err)
	}
	_, err = cbGet(t, tr, a.URL)
	require.ErrorIs(t, err, ErrRateLimited, "the call in flight still holds a's only permit")
	assert.EqualValues(t, 1, a.hits.Load())
	hosts := h.HostCircuitStates()
	assert.Contains(t, hosts, keyOf(mustURL(t, a.URL)).String())
	assert.NotContains(t, hosts, keyOf(mustURL(t, b.URL)).String(), "the idle host made room")
	a.unblock()
	require.NoError(t, <-done)
}

// The body of a 101 Switching Protocols response holds no permit, but its
// call lasts until Close, and so does the host's place in the table.
func TestHostTableKeepsUpgradedHost(t *testing.T) {
	u := newTestUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Upgrade") != "echo" {
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(conn, brw)
	})
	other := cbNewUpstream(http.StatusOK)
	defer other.Close()
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true, IdleTimeout: time.Millisecond}})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	key := keyOf(mustURL(t, u.URL())).String()

	req := newTestRequest(t, context.Background(), http.MethodGet, u.URL(), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	rwc := resp.Body.(io.ReadWriteCloser)
	defer rwc.Close()

	time.Sleep(pastIdle)
	_, err = cbGet(t, tr, other.URL) // a new host: the table forgets its idle hosts
	require.NoError(t, err)
	assert.Contains(t, h.HostCircuitStates(), key, "the upgraded connection is in use")
	_, err = io.WriteString(rwc, "ping\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(rwc).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "ping\n", line)

	require.NoError(t, rwc.Close())
	time.Sleep(pastIdle)
	visit(t, h.hosts, "http://another.test")
	assert.NotContains(t, h.HostCircuitStates(), key, "closed, the connection left its host idle")
}

// Among idle hosts, the one whose last call ended longest ago makes room,
// whenever its calls began.
func TestHostTableEvictsLeastRecentlyUsed(t *testing.T) {
	tbl := perHostTable(t, PerHostOptions{MaxHosts: 3, IdleTimeout: time.Hour})
	a := tbl.get(mustURL(t, "http://a.test"))
	b := tbl.get(mustURL(t, "http://b.test"))
	tbl.release(b)
	tbl.release(a) // a began first, but ended last
	visit(t, tbl, "http://c.test")
	visit(t, tbl, "http://d.test")
	assert.Equal(t, []string{"http://a.test", "http://c.test", "http://d.test"}, tableHosts(tbl), "b went")

	assert.Same(t, a, visit(t, tbl, "http://a.test"))
	visit(t, tbl, "http://e.test")
	assert.Equal(t, []string{"http://a.test", "http://d.test", "http://e.test"}, tableHosts(tbl), "c went")
	visit(t, tbl, "http://f.test")
	assert.Equal(t, []string{"http://a.test", "http://e.test", "http://f.test"}, tableHosts(tbl), "d went")
	visit(t, tbl, "http://g.test")
	assert.Equal(t, []string{"http://e.test", "http://f.test", "http://g.test"}, tableHosts(tbl), "a went")
}

// While every host is in use the table holds more than MaxHosts; once they
// are idle it comes back to MaxHosts and stays there.
func TestHostTableGrowsOnlyWhileInUse(t *testing.T) {
	tbl := perHostTable(t, PerHostOptions{MaxHosts: 2, IdleTimeout: time.Hour})
	var busy []*hostState
	for _, u := range []string{"http://a.test", "http://b.test", "http://c.test"} {
		busy = append(busy, tbl.get(mustURL(t, u)))
	}
	assert.Len(t, tableHosts(tbl), 3, "no host is idle: none is forgotten")
	for _, s := range busy {
		tbl.release(s)
	}
	for i := 0; i < 20; i++ {
		visit(t, tbl, fmt.Sprintf("http://h%d.test", i))
		require.Len(t, tableHosts(tbl), 2, "after host %d", i)
	}
}

// A host is idle from the end of its last call, not from its start.
func TestHostTableIdleFromCallEnd(t *testing.T) {
	tbl := perHostTable(t, PerHostOptions{IdleTimeout: time.Hour})
	s := tbl.get(mustURL(t, "http://a.test"))
	s2 := tbl.get(mustURL(t, "http://a.test"))
	require.Same(t, s, s2)
	tbl.release(s)
	started := tbl.now()
	tbl.release(s2)
	tbl.lru.Lock()
	defer tbl.lru.Unlock()
	assert.GreaterOrEqual(t, s.entry.idleSince, started, "the host is idle from its last call's end")
	assert.Zero(t, s.entry.inflight.Load())
}

// Under concurrent calls, with hosts forgotten all the time, calls in flight
// to one host at once always share its state.
func TestHostTableConcurrentCallsShareState(t *testing.T) {
	tbl := perHostTable(t, PerHostOptions{MaxHosts: 2, IdleTimeout: time.Nanosecond})
	type use struct {
		s *hostState
		n int
	}
	var mu sync.Mutex
	active := map[string]*use{}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				u := mustURL(t, fmt.Sprintf("http://h%d.test", (g+i)%5))
				s := tbl.get(u)
				mu.Lock()
				a := active[s.host]
				if a == nil {
					a = &use{s: s}
					active[s.host] = a
				}
				same := a.s == s
				a.n++
				mu.Unlock()
				if !assert.True(t, same, "two states in flight for %s", s.host) {
					return
				}
				mu.Lock()
				if a.n--; a.n == 0 {
					delete(active, s.host)
				}
				mu.Unlock()
				tbl.release(s)
			}
		}()
	}
	wg.Wait()
	visit(t, tbl, "http://last.test")
	assert.Equal(t, []string{"http://last.test"}, tableHosts(tbl), "every other host is idle, and forgotten")
}

// Known host: the cost every call pays, from get to release.
func BenchmarkHostTableKnownHost(b *testing.B) {
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true}})
	require.NoError(b, err)
	tbl := h.hosts
	u, err := url.Parse("http://a.test/x")
	require.NoError(b, err)
	tbl.release(tbl.get(u))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tbl.release(tbl.get(u))
	}
}

// Known hosts, called from every P at once.
func BenchmarkHostTableKnownHostParallel(b *testing.B) {
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true}})
	require.NoError(b, err)
	tbl := h.hosts
	us := make([]*url.URL, 8)
	for i := range us {
		us[i], err = url.Parse(fmt.Sprintf("http://h%d.test/x", i))
		require.NoError(b, err)
		tbl.release(tbl.get(us[i]))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			tbl.release(tbl.get(us[i%len(us)]))
		}
	})
}

// A new host meets a full table of 1,000 idle hosts and makes room.
func BenchmarkHostTableNewHostFull(b *testing.B) {
	const max = 1000
	h, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: true, MaxHosts: max, IdleTimeout: time.Hour}})
	require.NoError(b, err)
	tbl := h.hosts
	us := make([]*url.URL, 2*max) // each was evicted max hosts ago when met again
	for i := range us {
		us[i], err = url.Parse(fmt.Sprintf("http://h%d.test/x", i))
		require.NoError(b, err)
	}
	for _, u := range us[:max] {
		tbl.release(tbl.get(u))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tbl.release(tbl.get(us[(max+i)%len(us)]))
	}
}
