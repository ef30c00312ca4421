package resilience

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replica is an httptest upstream that counts its requests and answers as
// its handler says.
type replica struct {
	*httptest.Server
	hits atomic.Int64
}

func newReplica(t *testing.T, h http.HandlerFunc) *replica {
	r := &replica{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		h(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func answer(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, text) }
}

// bodies wraps a RoundTripper and counts the response bodies it hands out
// and those closed, so that a test can see every loser closed.
type bodies struct {
	base           http.RoundTripper
	opened, closed atomic.Int64
	returned       atomic.Int64 // RoundTrips that returned, with a response or an error
}

func (b *bodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(r)
	defer b.returned.Add(1)
	if resp != nil {
		b.opened.Add(1)
		resp.Body = &countedBody{ReadCloser: resp.Body, closed: &b.closed}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	closed *atomic.Int64
	once   sync.Once
}

func (c *countedBody) Close() error {
	c.once.Do(func() { c.closed.Add(1) })
	return c.ReadCloser.Close()
}

func endpointsOf(rs ...*replica) []Endpoint {
	eps := make([]Endpoint, len(rs))
	for i, r := range rs {
		eps[i] = Endpoint{URL: r.URL}
	}
	return eps
}

func routedGet(t *testing.T, tr http.RoundTripper, target string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, target, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// A slow primary is raced against the secondary, whose answer wins; the
// primary's attempt is cancelled.
func TestEndpointsSlowPrimaryLosesToSecondary(t *testing.T) {
	cancelled := make(chan struct{})
	primary := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // stuck until the race is lost
		close(cancelled)
	})
	secondary := newReplica(t, answer("secondary"))
	rec := &evRecorder{measures: true}
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging:   HedgingOptions{Enabled: true, Delay: 5 * time.Millisecond},
		Endpoints: endpointsOf(primary, secondary),
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	status, body := routedGet(t, tr, "http://orders.invalid/item")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "secondary", body)
	<-cancelled // the loser's request was cancelled: otherwise this blocks
	assert.EqualValues(t, 1, primary.hits.Load())
	assert.EqualValues(t, 1, secondary.hits.Load())
	require.Len(t, rec.of(EventHedge), 1)
	var endpoints []string
	for _, e := range rec.of(EventAttempt) {
		endpoints = append(endpoints, e.Endpoint)
	}
	assert.Contains(t, endpoints, secondary.URL, "the winner's attempt names its endpoint")
}

// An endpoint whose circuit is open is passed over at once: the first
// attempt goes to the next endpoint, with no hedge delay waited (Delay is an
// hour: waiting for it would time the test out).
func TestEndpointsOpenCircuitSkippedAtOnce(t *testing.T) {
	primary := newReplica(t, answer("primary"))
	secondary := newReplica(t, answer("secondary"))
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging:   HedgingOptions{Enabled: true, Delay: time.Hour},
		Endpoints: endpointsOf(primary, secondary),
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	h := tr.Handler()
	u, _ := url.Parse(primary.URL)
	s := h.hosts.get(u)
	s.breaker().Open()
	h.hosts.release(s)
	require.Equal(t, CircuitOpen, h.HostCircuitStates()[keyOf(u).String()])

	_, body := routedGet(t, tr, "http://orders.invalid/")
	assert.Equal(t, "secondary", body)
	assert.Zero(t, primary.hits.Load())
	assert.Empty(t, rec.of(EventHedge), "the first attempt itself went to the secondary")
	rejected := rec.of(EventCircuitRejected)
	require.Len(t, rejected, 1)
	assert.Equal(t, primary.URL, rejected[0].Endpoint)

	// Every endpoint open: the call fails fast with ErrCircuitOpen.
	u2, _ := url.Parse(secondary.URL)
	s2 := h.hosts.get(u2)
	s2.breaker().Open()
	h.hosts.release(s2)
	req, _ := http.NewRequest(http.MethodGet, "http://orders.invalid/", nil)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, ErrCircuitOpen)
	assert.Zero(t, primary.hits.Load())
	assert.EqualValues(t, 1, secondary.hits.Load())
}

// Weighted groups split first attempts by weight: 90/10 over a seeded run
// of 10,000 calls, within 1.5 points (five standard deviations).
func TestEndpointsWeightedSplit(t *testing.T) {
	stable := newReplica(t, answer("stable"))
	canary := newReplica(t, answer("canary"))
	tr, err := NewTransport(&http.Transport{}, Options{
		PerHost: PerHostOptions{Enabled: true},
		Retry:   RetryOptions{Disabled: true},
		Routing: RouteWeighted,
		Endpoints: []Endpoint{
			{URL: stable.URL, Weight: 90}, {URL: canary.URL, Weight: 10},
		},
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	var mu sync.Mutex
	src := rand.New(rand.NewPCG(1, 2))
	tr.Handler().rand = func(n uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		return src.Uint64N(n)
	}

	const calls = 10_000
	for range calls {
		routedGet(t, tr, "http://orders.invalid/")
	}
	share := float64(stable.hits.Load()) / calls
	assert.InDelta(t, 0.9, share, 0.015, "stable's share of first attempts")
	assert.EqualValues(t, calls, stable.hits.Load()+canary.hits.Load())
}

// A further attempt goes to a group not tried yet: with weights that send
// every first attempt to one group, the hedge goes to the other.
func TestEndpointsWeightedHedgeGoesElsewhere(t *testing.T) {
	first := newReplica(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) })
	second := newReplica(t, answer("second"))
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging: HedgingOptions{Enabled: true},
		Routing: RouteWeighted,
		Endpoints: []Endpoint{
			{URL: first.URL, Weight: 1_000_000}, {URL: second.URL, Weight: 1},
		},
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	tr.Handler().rand = func(uint64) uint64 { return 0 } // the first group with weight left

	_, body := routedGet(t, tr, "http://orders.invalid/")
	assert.Equal(t, "second", body)
	assert.EqualValues(t, 1, first.hits.Load())
	assert.EqualValues(t, 1, second.hits.Load())
}

// Without hedging, each retry goes to the next endpoint (failover), in
// order; the failed responses are drained and closed.
func TestEndpointsFailoverRetries(t *testing.T) {
	busy := func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) }
	a, b := newReplica(t, busy), newReplica(t, busy)
	c := newReplica(t, answer("c"))
	rec := &evRecorder{measures: true}
	base := &bodies{base: &http.Transport{}}
	tr, err := NewTransport(base, Options{
		PerHost:   PerHostOptions{Enabled: true},
		Retry:     RetryOptions{Delay: -1},
		Endpoints: endpointsOf(a, b, c),
		OnEvent:   rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	var report Report
	req, err := http.NewRequestWithContext(WithReport(context.Background(), &report), http.MethodGet, "http://orders.invalid/", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "c", string(got))
	assert.Equal(t, 3, report.Attempts)
	cu, _ := url.Parse(c.URL)
	assert.Equal(t, keyOf(cu).String(), report.Endpoint, "the endpoint that answered")
	var order []string
	for _, e := range rec.of(EventAttempt) {
		order = append(order, e.Endpoint)
	}
	assert.Equal(t, []string{a.URL, b.URL, c.URL}, order)
	assert.Equal(t, base.opened.Load(), base.closed.Load(), "every response closed")
}

// The Host header follows the endpoint, unless the caller set one of its
// own; the endpoint's path prefix goes before the request's path, and the
// query is kept.
func TestEndpointsHostHeaderAndPrefix(t *testing.T) {
	type seen struct{ host, uri string }
	got := make(chan seen, 2)
	up := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Host, r.RequestURI}
	})
	u, _ := url.Parse(up.URL)
	tr, err := NewTransport(&http.Transport{}, Options{
		Hedging:   HedgingOptions{Enabled: true},
		Endpoints: []Endpoint{{URL: up.URL + "/api/"}},
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	routedGet(t, tr, "http://orders.invalid/items?id=7")
	assert.Equal(t, seen{u.Host, "/api/items?id=7"}, <-got)

	req, _ := http.NewRequest(http.MethodGet, "http://orders.invalid/items", nil)
	req.Host = "orders.example"
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, seen{"orders.example", "/api/items"}, <-got)
}

// A handled failure sends the hedge to the next endpoint at once; the
// failure, kept until the winner came, is drained and closed, and so is
// every other response.
func TestEndpointsLosersClosed(t *testing.T) {
	failing := newReplica(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) })
	healthy := newReplica(t, answer("ok"))
	base := &bodies{base: &http.Transport{}}
	tr, err := NewTransport(base, Options{
		Hedging:   HedgingOptions{Enabled: true, Delay: time.Hour},
		Endpoints: endpointsOf(failing, healthy),
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	for range 5 {
		_, body := routedGet(t, tr, "http://orders.invalid/")
		assert.Equal(t, "ok", body)
	}
	assert.EqualValues(t, 10, base.opened.Load())
	require.Eventually(t, func() bool { return base.closed.Load() == 10 }, 5*time.Second, time.Millisecond,
		"the losers are drained and closed in the background")
}

func TestEndpointsValidation(t *testing.T) {
	ok := Endpoint{URL: "http://a.example"}
	for _, tc := range []struct {
		name  string
		o     Options
		field string
	}{
		{"empty", Options{Endpoints: []Endpoint{}}, "Endpoints"},
		{"too many", Options{Endpoints: make([]Endpoint, 17)}, "Endpoints"},
		{"scheme", Options{Endpoints: []Endpoint{{URL: "ftp://a.example"}}}, "Endpoints[0].URL"},
		{"no host", Options{Endpoints: []Endpoint{ok, {URL: "http:///x"}}}, "Endpoints[1].URL"},
		{"query", Options{Endpoints: []Endpoint{{URL: "http://a.example/?x=1"}}}, "Endpoints[0].URL"},
		{"userinfo", Options{Endpoints: []Endpoint{{URL: "http://u:p@a.example"}}}, "Endpoints[0].URL"},
		{"same authority", Options{Endpoints: []Endpoint{ok, {URL: "HTTP://A.example:80/v2"}}}, "Endpoints[1].URL"},
		{"weight", Options{Endpoints: []Endpoint{{URL: ok.URL, Weight: -1}}}, "Endpoints[0].Weight"},
		{"routing", Options{Routing: 7}, "Routing"},
		{"hosts", Options{Endpoints: []Endpoint{ok, {URL: "http://b.example"}}, PerHost: PerHostOptions{MaxHosts: 1}}, "PerHost.MaxHosts"},
		{"percentile", Options{Hedging: HedgingOptions{DelayPercentile: 1}}, "Hedging.DelayPercentile"},
		{"floor over ceiling", Options{Hedging: HedgingOptions{MinDelay: time.Second, MaxDelay: time.Millisecond}}, "Hedging.MaxDelay"},
		{"extra load", Options{Hedging: HedgingOptions{MaxExtraLoad: -0.5}}, "Hedging.MaxExtraLoad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewHandler(tc.o)
			var oe *optionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.field)
			assert.NotContains(t, err.Error(), "u:p", "no credentials in errors")
		})
	}
	for _, perHost := range []bool{false, true} { // endpoints need no PerHost
		_, err := NewHandler(Options{PerHost: PerHostOptions{Enabled: perHost}, Hedging: HedgingOptions{MaxExtraLoad: NoExtraLoadCap}, Endpoints: []Endpoint{ok}})
		require.NoError(t, err)
	}
}

// No Endpoints: nothing is routed, and the call's URL is the request's.
func TestEndpointsNoneRouteNothing(t *testing.T) {
	h, err := NewHandler(Options{})
	require.NoError(t, err)
	assert.Nil(t, h.cfg.Load().route)
}

// Issue 18, item 10: an explicitly empty list of endpoints is refused,
// naming the field, from Go and from a file; nil means none.
func TestEndpointsEmptyListRefused(t *testing.T) {
	_, err := NewHandler(Options{Endpoints: []Endpoint{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "resilience: ")
	assert.Contains(t, err.Error(), "Endpoints ([]): must hold at least one endpoint")

	_, err = NewHandler(Options{Endpoints: nil})
	require.NoError(t, err)

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"endpoints": []}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "upstreams.a.endpoints ([]): must hold at least one endpoint")

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"a": {"hedging": {"endpoints": [{"url": "http://a"}]}}}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `upstreams.a.hedging.endpoints: moved: write "endpoints" beside "hedging"`, "the old place says where the field went")
}

// Endpoints need no PerHost: with retries alone (no hedging), each
// endpoint has a circuit of its own, reported by authority, and calls fail
// over to the one left healthy while the handler's own limits stay one for
// all calls.
func TestEndpointsWithoutPerHost(t *testing.T) {
	down := newReplica(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	up := newReplica(t, answer("up"))
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:          RetryOptions{MaxRetries: 1, Delay: time.Millisecond, IgnoreRetryAfter: true},
		RetryBudget:    RetryBudgetOptions{Disabled: true},
		CircuitBreaker: CircuitBreakerOptions{FailureRatio: 0.5, MinimumThroughput: 4, BreakDuration: time.Hour},
		Endpoints:      endpointsOf(down, up),
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	for range 8 {
		status, body := routedGet(t, tr, "http://orders.invalid/")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "up", body, "a failover retry answers")
	}
	h := tr.Handler()
	du, _ := url.Parse(down.URL)
	uu, _ := url.Parse(up.URL)
	assert.Equal(t, map[string]CircuitState{keyOf(du).String(): CircuitOpen, keyOf(uu).String(): CircuitClosed}, h.HostCircuitStates())
	assert.Equal(t, CircuitOpen, h.CircuitState(), "the handler reports its least healthy endpoint, as with PerHost")
	assert.EqualValues(t, 4, down.hits.Load(), "the open circuit passes the endpoint over")
	assert.ElementsMatch(t, []string{keyOf(du).String(), keyOf(uu).String()}, slices.Collect(maps.Keys(h.OverloadStats())),
		"each endpoint has an overload limit of its own")
	assert.NotNil(t, h.shared, "admission stays the handler's")

	h.CloseCircuit()
	assert.Equal(t, CircuitClosed, h.HostCircuitStates()[keyOf(du).String()], "CloseCircuit closes every endpoint's")
}

// A running handler without PerHost takes endpoints from an Update, and
// gives them up again: the next call goes where the options say.
func TestEndpointsByUpdate(t *testing.T) {
	own := newReplica(t, answer("own"))
	other := newReplica(t, answer("other"))
	h, err := NewHandler(Options{})
	require.NoError(t, err)
	tr := h.Transport(&http.Transport{})
	defer tr.CloseIdleConnections()
	_, body := routedGet(t, tr, own.URL)
	assert.Equal(t, "own", body)

	require.NoError(t, h.Update(Options{Endpoints: endpointsOf(other)}))
	_, body = routedGet(t, tr, own.URL)
	assert.Equal(t, "other", body, "routed to the endpoint")
	ou, _ := url.Parse(other.URL)
	assert.Equal(t, map[string]CircuitState{keyOf(ou).String(): CircuitClosed}, h.HostCircuitStates())

	require.NoError(t, h.Update(Options{}))
	_, body = routedGet(t, tr, own.URL)
	assert.Equal(t, "own", body, "the request's own URL again")
}

// An endpoint's events name it by its host table's state (label): the
// authority in its normal form, whatever the spelling of its URL.
func TestEndpointLabelIsItsStatesHost(t *testing.T) {
	rt, err := resolveEndpoints([]Endpoint{{URL: "HTTP://Orders.Example:80/v1/"}, {URL: "https://orders.example:443"}}, RouteOrdered, func(field string, value any, reason string) error {
		return fmt.Errorf("%s %v %s", field, value, reason)
	})
	require.NoError(t, err)
	h, err := NewHandler(Options{})
	require.NoError(t, err)
	for i, want := range []string{"http://orders.example", "https://orders.example"} {
		ep := &rt.eps[i]
		var e Event
		ep.label(&e)
		assert.Equal(t, want, e.Host)
		s := h.hosts.get(&ep.url)
		assert.Equal(t, s.host, e.Host)
		h.hosts.release(s)
	}
	assert.Equal(t, "HTTP://Orders.Example:80/v1", rt.eps[0].base)
}
