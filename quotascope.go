package resilience

import (
	"hash/maphash"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// Quotas scoped to a resource. An answer that names the resource or
// partition its quota belongs to (X-RateLimit-Resource, as GitHub's
// "core" and "search"; the IETF draft's partition key) speaks of the calls
// that count against it, not of every call of the host. Which later calls
// those are, nothing in a request says: GitHub's resource is not derived
// from the URL by any rule it publishes, and a partition key may stand for
// a user, an application or a resource. So such a quota is not counted
// down here, and holds back only the calls known to count against it:
//
//   - A refusal (a 429, or a 403, that names the resource and says to
//     wait: a Retry-After, or nothing left until a reset ahead) pauses its
//     resource until then, for the principal that sent it (a hash of the
//     call's Authorization, Cookie and URL userinfo: other credentials
//     have a quota of their own), and makes its route (method, host and
//     path, the query left out) known to count against it.
//   - A later call on a known route waits for the pause or fails at once,
//     as RateLimitOptions.Wait says. The call that got the refusal is such
//     a call when it is sent again.
//   - A call on any other route goes, and the server decides: a route is
//     learnt from the server's refusal, once per route and window. An
//     answer not refused that names the resource with some of it left
//     ends its pause.
//
// Bounded: at most maxScopedResources paused resources and
// maxScopedRoutes routes are kept per host, routes longer than
// maxScopedRouteBytes are not, and ended pauses make room. When the table
// is full of pauses still running, a new refusal is not kept: its calls
// go, and the server decides. Until an answer names a resource and
// refuses a call, a call pays one atomic load more.

// Bounds on what a host keeps of scoped quotas.
const (
	maxScopedResources  = 32  // resources (per principal) paused at once
	maxScopedRoutes     = 256 // routes known to count against one
	maxScopedRouteBytes = 512 // of a route's method, host and path
)

// scopedQuotas is a host's record of its refusals of quotas scoped to a
// resource.
type scopedQuotas struct {
	until atomic.Int64 // the latest end of a pause kept, Unix nanoseconds; 0: none was

	mu        sync.Mutex
	seed      maphash.Seed // set with the first pause, before until
	resources map[scopedResource]*scopedPause
	routes    map[quotaRoute]*scopedPause
}

// A scopedResource is a resource's quota for one principal.
type scopedResource struct {
	name string
	cred uint64
}

// A quotaRoute is what a call's route is known by: its method, host and
// path, and its principal.
type quotaRoute struct {
	method, host, path string
	cred               uint64
}

// A scopedPause is a resource's pause after a refusal.
type scopedPause struct {
	until time.Time
	said  *serverAnswer // the refusal
}

// maybe reports whether a pause may hold back a call at now: the cheap
// test before the route is looked up.
func (s *scopedQuotas) maybe(now time.Time) bool {
	u := s.until.Load()
	return u != 0 && now.UnixNano() < u
}

// route is req's route, and whether it may be kept (it is not too long).
// s.seed must be set.
func (s *scopedQuotas) route(req *http.Request) (quotaRoute, bool) {
	u := req.URL
	path := u.Path
	if u.Opaque != "" {
		path = u.Opaque
	}
	rt := quotaRoute{method: req.Method, host: u.Host, path: path, cred: s.principal(req)}
	return rt, len(rt.method)+len(rt.host)+len(rt.path) <= maxScopedRouteBytes
}

// principal is a hash of req's credentials: its Authorization and Cookie
// fields and its URL's userinfo. s.seed must be set.
func (s *scopedQuotas) principal(req *http.Request) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	field := func(name, v string) {
		h.WriteString(name)
		h.WriteByte(0)
		h.WriteString(v)
		h.WriteByte(0)
	}
	if ui := req.URL.User; ui != nil {
		pw, _ := ui.Password()
		field("user", ui.Username())
		field("password", pw)
	}
	for _, name := range [...]string{"Authorization", "Cookie"} {
		for _, v := range headers.Values(req.Header, name) {
			field(name, v)
		}
	}
	return h.Sum64()
}

// held returns how long the pause of a resource that req's route is known
// to count against has yet to run at now, or 0, and the refusal that
// started it.
func (s *scopedQuotas) held(req *http.Request, now time.Time) (time.Duration, *serverAnswer) {
	rt, ok := s.route(req)
	if !ok {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.routes[rt]; p != nil && p.until.After(now) {
		return p.until.Sub(now), p.said
	}
	return 0, nil
}

// observe reads resp, the answer at now to req, whose header with
// canonical names h announced r, a quota scoped to r.Resource: a refusal
// pauses the resource for its principal, at most for most, and makes
// req's route known to count against it; an answer with some left ends
// that pause.
func (s *scopedQuotas) observe(req *http.Request, resp *http.Response, h http.Header, r headers.Quota, now time.Time, most time.Duration) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusForbidden {
		if r.Remaining > 0 && s.maybe(now) {
			s.lift(req, r.Resource)
		}
		return
	}
	var wait time.Duration
	if d, ok := headers.RetryAfter(resp, now); ok && d > 0 {
		wait = d
	} else if r.Remaining == 0 && r.HasReset {
		wait = r.Reset
	}
	if wait <= 0 || req == nil {
		return // nothing to wait for: the next call goes
	}
	s.pause(req, r.Resource, now, now.Add(min(wait, most)), keepAnswer(resp, h, quotaName(r), r.Resource))
}

// pause pauses resource for req's principal until until, after the refusal
// said, and makes req's route known to count against it, as room allows.
func (s *scopedQuotas) pause(req *http.Request, resource string, now, until time.Time, said *serverAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resources == nil {
		s.seed = maphash.MakeSeed()
		s.resources = make(map[scopedResource]*scopedPause)
		s.routes = make(map[quotaRoute]*scopedPause)
	}
	rt, routed := s.route(req)
	if !routed {
		return // a route too long to keep: no call would be held back
	}
	key := scopedResource{name: resource, cred: rt.cred}
	p := s.resources[key]
	if p == nil {
		if len(s.resources) >= maxScopedResources {
			s.sweepLocked(now)
		}
		if len(s.resources) >= maxScopedResources {
			return // full of running pauses: the server decides
		}
		key.name = strings.Clone(key.name)
		p = &scopedPause{}
		s.resources[key] = p
	}
	p.until, p.said = until, said // the server's latest word
	if _, known := s.routes[rt]; !known && len(s.routes) >= maxScopedRoutes {
		s.sweepLocked(now)
	}
	if _, known := s.routes[rt]; known || len(s.routes) < maxScopedRoutes {
		rt.method, rt.host, rt.path = strings.Clone(rt.method), strings.Clone(rt.host), strings.Clone(rt.path)
		s.routes[rt] = p
	}
	for {
		u := s.until.Load()
		if until.UnixNano() <= u || s.until.CompareAndSwap(u, until.UnixNano()) {
			break
		}
	}
}

// lift ends the pause of resource for req's principal: an answer says some
// of its quota is left.
func (s *scopedQuotas) lift(req *http.Request, resource string) {
	if req == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resources == nil {
		return
	}
	if p := s.resources[scopedResource{name: resource, cred: s.principal(req)}]; p != nil {
		p.until = time.Time{}
	}
}

// sweepLocked forgets the pauses that have ended at now, and the routes
// that point to them. s.mu must be held.
func (s *scopedQuotas) sweepLocked(now time.Time) {
	for rt, p := range s.routes {
		if !p.until.After(now) {
			delete(s.routes, rt)
		}
	}
	for k, p := range s.resources {
		if !p.until.After(now) {
			delete(s.resources, k)
		}
	}
}
