package resilience

import (
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
)

// Routing across endpoints: where each attempt of a call goes when
// Endpoints is set. The retry loop (retry.go) and the hedging
// race (hedge.go) both ask the call's route for the next attempt's
// endpoint; each endpoint is an authority of the handler's host table, so
// it has a circuit breaker of its own, and an endpoint whose circuit
// refuses is passed over at once for the next.

// A route is one call's way through its handler's endpoints. Only the
// goroutine that runs the call's loop touches it. It lives in that loop
// (run or hedge), not in the call, so that a call without endpoints pays
// nothing for it, not even a field: the call struct sits just under a size
// class boundary (640 bytes, held by callsize_test.go's
// TestCallFitsItsSizeClass).
type route struct {
	r       *router
	tried   uint32 // the endpoints the call has sent to or found refusing, by index
	dropped uint32 // the endpoints that failed the call in a way no retry on them mends (endpointFault)
	sent    uint32 // the endpoints attempts of the call ended on (ended)
	paused  uint32 // the endpoints a hedge waits for (hedgePauses): passed over while another is open
	next    int    // RouteOrdered: the index of the next attempt's endpoint
	last    int    // the endpoint of the latest attempt sent, or of the answer the call ends on
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
	if o := open &^ rt.paused; o != 0 {
		open = o
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
	x := h.rand(total)
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
// server that answers in plain HTTP), or its host name, which does not
// exist. Such a failure is not transient (IsTransient), yet another
// endpoint is another server: the call moves on to it, and the failure
// counts against the endpoint's own circuit. Classified by the errors'
// types, never their text.
func endpointFault(err error) bool {
	return err != nil && (isTLSFailure(err) || isNameNotFound(err))
}

// connectionFailure reports whether err, the error of an attempt that got
// no response, says that its connection failed before any response came:
// the request never reached the endpoint (undelivered), or the connection
// was reset or closed before a response byte (the request may have been
// written, and the method rule alone decides whether it is sent again). A
// retry after such a failure need not wait to go to another endpoint: the
// failure says nothing of it. Classified by the errors' types and the
// operation net names, never their text.
func connectionFailure(err error) bool {
	return undelivered(err) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// undelivered reports whether err says that an attempt's request never left
// the client: the dial failed (refused, unreachable, a name that does not
// resolve, a dial timeout), or the TLS handshake did, which comes before
// any byte of the request.
func undelivered(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) || isTLSFailure(err)
}

// ended notes how the attempt sent to endpoint i ended: an endpointFault
// drops the endpoint from the call's route, for good.
func (rt *route) ended(i int, err error) {
	rt.sent |= 1 << i
	if endpointFault(err) {
		rt.drop(i)
	}
}

// drop drops endpoint i from the call's route, for good.
func (rt *route) drop(i int) {
	rt.dropped |= 1 << i
	if rt.drawn == i+1 {
		rt.drawn = 0
	}
}

// fresh reports whether endpoint i is one no attempt of the call has ended
// on yet.
func (rt *route) fresh(i int) bool { return i >= 0 && rt.sent&(1<<i) == 0 }

// left reports whether an endpoint is left that the call has not dropped.
func (rt *route) left() bool { return rt.dropped != uint32(1)<<len(rt.r.eps)-1 }

// state returns endpoint i's host state, held until the call ends.
func (rt *route) state(h *Handler, i int) *hostState {
	if s := rt.held[i]; s != nil {
		return s
	}
	s := h.hosts.get(&rt.r.eps[i].url)
	rt.held[i] = s
	return s
}

// routeEnded gives back the endpoints' host states when the call's loop
// ends (the winner's body may still be read: a host state released early
// is at worst forgotten and made afresh), and names the endpoint of the
// answer in the call's Report, if it asked for one.
func (c *call) routeEnded(rt *route) {
	rt.release(c.h)
	if c.wantsReport() && c.attempts > 0 {
		c.over.report.Endpoint = rt.r.eps[rt.last].host
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

// admitRouted picks the endpoint of attempt a and takes its circuit's
// permit, passing over at once every endpoint whose circuit refuses (each
// refusal is an EventCircuitRejected naming the endpoint). It sets a's
// endpoint, its index, its state and the probe number as the circuit's
// Admit returns it, or returns the last reason when every endpoint
// refused. The route's last endpoint is not a's until a is sent: an
// attempt admitted may still be shed, and never answer.
func (c *call) admitRouted(rt *route, a *attempt) (refused error) {
	if c.h.isolated.Load() {
		return ErrIsolated
	}
	refused = errEndpointsDropped // unless a circuit refuses: the callers ask left() first
	for range rt.r.eps {
		i := rt.pick(c.h)
		if i < 0 {
			break
		}
		s := rt.state(c.h, i)
		var probe uint64
		probe, refused = s.circuit.Admit()
		if refused == nil {
			a.ep, a.idx, a.s, a.probe, a.admitted = &rt.r.eps[i], i, s, probe, true
			return nil
		}
		e := Event{Kind: EventCircuitRejected, Attempt: int(c.attempts) + 1, Err: refused}
		rt.r.eps[i].label(&e)
		c.emit(e)
	}
	return refused
}

// errEndpointsDropped is why no endpoint is left for an attempt when every
// one failed the call (endpointFault).
var errEndpointsDropped = errors.New("resilience: every endpoint failed the call")

// label names ep in e, as every event about an attempt sent to it does.
func (ep *endpoint) label(e *Event) { e.Endpoint, e.Host = ep.base, ep.host }

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
