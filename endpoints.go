package resilience

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
)

// routing is a call with Endpoints choosing its endpoints.
type routing struct{ *call }

// Routing across endpoints: where each attempt of a call goes when
// Endpoints is set. The retry loop (standard.go) and the hedging
// loop (hedge.go) both ask the call's route for the next attempt's
// endpoint; each endpoint is an authority of the handler's host table, so
// it has a circuit breaker of its own, and an endpoint whose circuit
// refuses is passed over at once for the next.

// Routing says how a call's attempts are spread over Endpoints.
type Routing int

// Routing modes. The zero value is RouteOrdered.
const (
	RouteOrdered  Routing = iota // from the first endpoint, each to the next
	RouteWeighted                // at random by Weight, untried ones first
)

func (r Routing) String() string {
	switch r {
	case RouteOrdered:
		return "ordered"
	case RouteWeighted:
		return "weighted"
	}
	return fmt.Sprintf("Routing(%d)", int(r))
}

// An Endpoint is one place the attempts of a call can go: a deployment, a
// replica or a region of the upstream. See Options.Endpoints.
type Endpoint struct {
	URL    string // the base, required: scheme://host[:port][/prefix]
	Weight int    // RouteWeighted's share, at most 1000000; default 1
}

// maxEndpoints bounds Endpoints: a route keeps which endpoints a
// call tried in one word, and its states in a fixed array.
const maxEndpoints = 16

// An endpoint is an Endpoint resolved.
type endpoint struct {
	base      string  // as configured, without a trailing slash: what events and metrics say
	url       url.URL // scheme and host only: the host table's key
	prefix    string  // the path prefix, without a trailing slash; "" for none
	rawPrefix string  // prefix, escaped as written, for a request with a RawPath
	weight    int
}

// A router is the endpoints of a handler's options, resolved.
type router struct {
	mode  Routing
	eps   []endpoint
	total uint64 // the sum of the weights
}

// resolveEndpoints validates the endpoints of o and returns their router,
// or nil when there are none.
func resolveEndpoints(o *Options, bad badOption) (*router, error) {
	switch {
	case o.Routing < RouteOrdered || o.Routing > RouteWeighted:
		return nil, bad("Routing", o.Routing, "must be RouteOrdered or RouteWeighted")
	case o.Endpoints == nil:
		return nil, nil
	case len(o.Endpoints) == 0:
		// An explicit empty list (JSON []) is a mistake, not "none": a
		// list that lost its entries would otherwise send every call to
		// the request's own URL without a word.
		return nil, bad("Endpoints", "[]", "must hold at least one endpoint; leave it unset for none")
	case len(o.Endpoints) > maxEndpoints:
		return nil, bad("Endpoints", len(o.Endpoints), fmt.Sprintf("must hold at most %d endpoints", maxEndpoints))
	}
	rt := &router{mode: o.Routing, eps: make([]endpoint, len(o.Endpoints))}
	seen := make(map[hostKey]int, len(o.Endpoints))
	for i, e := range o.Endpoints {
		field := fmt.Sprintf("Endpoints[%d]", i)
		u, err := url.Parse(e.URL)
		switch {
		case err != nil:
			return nil, bad(field+".URL", e.URL, "is not a URL")
		case u.Scheme != "http" && u.Scheme != "https":
			return nil, bad(field+".URL", e.URL, `must start with "http://" or "https://"`)
		case u.Host == "":
			return nil, bad(field+".URL", e.URL, "has no host")
		case u.User != nil:
			return nil, bad(field+".URL", "(redacted)", "must not hold user information; set credentials on the request")
		case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
			return nil, bad(field+".URL", e.URL, "must not have a query or a fragment: it is a base URL")
		case e.Weight < 0 || e.Weight > 1_000_000:
			return nil, bad(field+".Weight", e.Weight, "must be between 1 and 1000000")
		}
		key := keyOf(u)
		if j, ok := seen[key]; ok {
			return nil, bad(field+".URL", e.URL, fmt.Sprintf("has the authority of Endpoints[%d]; each endpoint needs its own, for a circuit of its own", j))
		}
		seen[key] = i
		ep := endpoint{
			base:      strings.TrimSuffix(e.URL, "/"),
			url:       url.URL{Scheme: key.scheme, Host: key.host},
			prefix:    strings.TrimSuffix(u.Path, "/"),
			rawPrefix: strings.TrimSuffix(u.EscapedPath(), "/"),
			weight:    max(1, e.Weight),
		}
		rt.eps[i] = ep
		rt.total += uint64(ep.weight)
	}
	return rt, nil
}

// A route is one call's way through its handler's endpoints. Only the
// goroutine that runs the call's loop touches it. It lives in that loop
// (run or hedge), not in the call, so that a call without endpoints pays
// nothing for it, not even a field: the call struct sits just under a size
// class boundary (320 bytes).
type route struct {
	r       *router
	tried   uint32 // the endpoints the call has sent to or found refusing, by index
	dropped uint32 // the endpoints that failed the call in a way no retry on them mends (endpointFault)
	next    int    // RouteOrdered: the index of the next attempt's endpoint
	last    int    // the endpoint of the latest attempt sent
	drawn   int    // 1 + the endpoint ahead drew for the next pick; 0 for none
	held    [maxEndpoints]*hostState
}

// pick returns the index of the next endpoint to try, and marks it tried:
// the one ahead drew, if it did. It returns -1 when every endpoint is
// dropped.
func (rt *route) pick(h *Handler) int {
	if rt.drawn > 0 {
		i := rt.drawn - 1
		rt.drawn = 0
		return i
	}
	return rt.draw(h)
}

// ahead returns the endpoint the next pick will return, drawing it now
// (-1 when every endpoint is dropped): the retry loop asks whether the next
// attempt goes to the endpoint that answered, whose Retry-After applies to
// it alone.
func (rt *route) ahead(h *Handler) int {
	if rt.drawn == 0 {
		rt.drawn = rt.draw(h) + 1
	}
	return rt.drawn - 1
}

func (rt *route) draw(h *Handler) int {
	n := len(rt.r.eps)
	open := (uint32(1)<<n - 1) &^ rt.dropped
	if open == 0 {
		return -1
	}
	if rt.r.mode == RouteOrdered {
		for {
			i := rt.next % n
			rt.next++
			if open&(1<<i) != 0 {
				rt.tried |= 1 << i
				return i
			}
		}
	}
	if rt.tried&open == open {
		rt.tried = 0 // every endpoint left tried: start over
	}
	var total uint64
	for i := range rt.r.eps {
		if open&^rt.tried&(1<<i) != 0 {
			total += uint64(rt.r.eps[i].weight)
		}
	}
	x := h.randN(total)
	for i := range rt.r.eps {
		if open&^rt.tried&(1<<i) == 0 {
			continue
		}
		if w := uint64(rt.r.eps[i].weight); x < w {
			rt.tried |= 1 << i
			return i
		} else {
			x -= w
		}
	}
	panic("unreachable: x < total")
}

// endpointFault reports whether err, an attempt's error, is a failure of
// its endpoint that no retry against that endpoint can mend, but that says
// nothing of the other endpoints: its TLS (a certificate the client does
// not trust or that names another host, a handshake the server refused, a
// server that answers in plain HTTP). Such a failure is not transient
// (IsTransient), yet another endpoint is another server: the call moves on
// to it, and the failure counts against the endpoint's own circuit.
// Classified by the errors' types, never their text.
func endpointFault(err error) bool {
	return err != nil && isTLSFailure(err)
}

// ended notes how the attempt sent to endpoint i ended: an endpointFault
// drops the endpoint from the call's route, for good.
func (rt *route) ended(i int, err error) {
	if endpointFault(err) {
		rt.dropped |= 1 << i
		if rt.drawn == i+1 {
			rt.drawn = 0
		}
	}
}

// left reports whether an endpoint is left that the call has not dropped.
func (rt *route) left() bool { return rt.dropped != uint32(1)<<len(rt.r.eps)-1 }

// randN returns a random number in [0, n): from the handler's own source
// when a test set one, from math/rand/v2's otherwise.
func (h *Handler) randN(n uint64) uint64 {
	if h.rand != nil {
		return h.rand(n)
	}
	return rand.Uint64N(n)
}

// state returns endpoint i's host state, held until the call ends.
func (rt *route) state(h *Handler, i int) *hostState {
	if s := rt.held[i]; s != nil {
		return s
	}
	s := h.hosts.get(&rt.r.eps[i].url)
	rt.held[i] = s
	return s
}

// newRoute returns the call's route, or nil without Endpoints.
func (c routing) newRoute() *route {
	if c.cfg.route == nil {
		return nil
	}
	return &route{r: c.cfg.route}
}

// routeEnded gives back the endpoints' host states when the call's loop
// ends (the winner's body may still be read: a host state released early
// is at worst forgotten and made afresh), and names the endpoint of the
// answer in the call's Report, if it asked for one.
func (c routing) routeEnded(rt *route) {
	rt.release(c.h)
	if c.wantsReport() && c.attempts > 0 {
		c.over.report.Endpoint = rt.r.eps[rt.last].url.String()
	}
}

// release gives back the host states the call held.
func (rt *route) release(h *Handler) {
	for i, s := range rt.held {
		if s != nil {
			rt.held[i] = nil
			h.hosts.release(s)
		}
	}
}

// admitRouted picks the endpoint of the next attempt and takes its
// circuit's permit, passing over at once every endpoint whose circuit
// refuses (each refusal is an EventCircuitRejected naming the endpoint).
// It returns the endpoint, its state and the probe number as
// hostState.admit does, or, when every endpoint refused, the last reason.
func (c routing) admitRouted(rt *route) (ep *endpoint, s *hostState, probe uint64, refused error) {
	if c.h.isolated.Load() {
		return nil, nil, 0, ErrIsolated
	}
	refused = errEndpointsDropped // unless a circuit refuses: the callers ask left() first
	for range rt.r.eps {
		i := rt.pick(c.h)
		if i < 0 {
			break
		}
		s = rt.state(c.h, i)
		probe, refused = s.circuit.Admit()
		if refused == nil {
			rt.last = i
			return &rt.r.eps[i], s, probe, nil
		}
		c.emit(Event{Kind: EventCircuitRejected, Attempt: c.attempts + 1, Host: s.host, Endpoint: rt.r.eps[i].base, Err: refused})
	}
	return nil, nil, 0, refused
}

// errEndpointsDropped is why no endpoint is left for an attempt when every
// one failed the call (endpointFault).
var errEndpointsDropped = errors.New("resilience: every endpoint failed the call")

// retarget points r, an attempt's request, at the endpoint: its URL is the
// caller's with the scheme, the authority and the path prefix of the
// endpoint, and its Host header follows, unless the caller set one of its
// own (a Request.Host other than its URL's).
func (e *endpoint) retarget(r *http.Request) {
	u := *r.URL
	u.Scheme, u.Host = e.url.Scheme, e.url.Host
	if e.prefix != "" {
		u.Path = e.prefix + withSlash(u.Path)
		if u.RawPath != "" {
			u.RawPath = e.rawPrefix + withSlash(u.RawPath)
		}
	}
	if r.Host == "" || r.Host == r.URL.Host {
		r.Host = ""
	}
	r.URL = &u
}

func withSlash(p string) string {
	if p == "" || p[0] == '/' {
		return p
	}
	return "/" + p
}

func routingField(o *fileOptions, raw json.RawMessage, path string) error {
	var s string
	_ = json.Unmarshal(raw, &s)
	for _, r := range []Routing{RouteOrdered, RouteWeighted} {
		if s == r.String() {
			o.Routing = r
			return nil
		}
	}
	return configErr(path, "want \"ordered\" or \"weighted\", got %s", brief(raw))
}

var endpointFields = fieldSet[Endpoint]{
	"url": func(e *Endpoint, raw json.RawMessage, path string) error {
		if err := json.Unmarshal(raw, &e.URL); err != nil {
			return configErr(path, "want a base URL such as \"https://eu.orders.internal/api\", got %s", brief(raw))
		}
		return nil
	},
	"weight": intField(func(e *Endpoint) *int { return &e.Weight }, keepZero),
}

// endpointsField reads endpoints, a list of {"url": ..., "weight": ...}.
// An upstream's list replaces the defaults'.
func endpointsField(o *fileOptions, raw json.RawMessage, path string) error {
	var list []json.RawMessage
	if err := strictUnmarshal(raw, &list); err != nil || list == nil {
		return configErr(path, "want a list of endpoints such as [{\"url\": \"https://a.internal\"}], got %s", brief(raw))
	}
	eps := make([]Endpoint, len(list))
	for i, item := range list {
		p := fmt.Sprintf("%s[%d]", path, i)
		if err := endpointFields.decode(&eps[i], item, p); err != nil {
			return err
		}
		if eps[i].URL == "" {
			return configErr(p+".url", "is missing: every endpoint needs its base URL")
		}
	}
	o.Endpoints = eps
	return nil
}
