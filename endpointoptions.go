package resilience

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

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
	host      string  // url as a string: the name of its state in the host table
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

// resolveEndpoints validates Options.Endpoints and Options.Routing, and
// returns their router, or nil when there are no endpoints.
func resolveEndpoints(eps []Endpoint, mode Routing, bad badOption) (*router, error) {
	switch {
	case mode < RouteOrdered || mode > RouteWeighted:
		return nil, bad("Routing", mode, "must be RouteOrdered or RouteWeighted")
	case eps == nil:
		return nil, nil
	case len(eps) == 0:
		// An explicit empty list (JSON []) is a mistake, not "none": a
		// list that lost its entries would otherwise send every call to
		// the request's own URL without a word.
		return nil, bad("Endpoints", "[]", "must hold at least one endpoint; leave it unset for none")
	case len(eps) > maxEndpoints:
		return nil, bad("Endpoints", len(eps), fmt.Sprintf("must hold at most %d endpoints", maxEndpoints))
	}
	rt := &router{mode: mode, eps: make([]endpoint, len(eps))}
	seen := make(map[hostKey]int, len(eps))
	for i, e := range eps {
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
			host:      key.String(),
			prefix:    strings.TrimSuffix(u.Path, "/"),
			rawPrefix: strings.TrimSuffix(u.EscapedPath(), "/"),
			weight:    max(1, e.Weight),
		}
		rt.eps[i] = ep
		rt.total += uint64(ep.weight)
	}
	return rt, nil
}

func routingField(o *Options, raw json.RawMessage, path string) error {
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
func endpointsField(o *Options, raw json.RawMessage, path string) error {
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
