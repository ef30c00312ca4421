// Package server is the server half of the deadline and retry contract:
// net/http middleware that reads the budget and the attempt number a
// caller sends with each request, puts the budget on the request's context
// as a deadline, and refuses, before any work and with 503, a request whose
// budget is spent or too small to be useful, and retried requests first
// when too large a share of what it serves is retries or when it has too
// many requests in flight. A refused retry, and a refused request whose
// budget is spent, carry the pushback "do not retry". Sending the headers
// is the client half's part, in package resilience;
// docs/deadline-contract.md describes both.
//
// A budget header that is absent or malformed (several values, empty, a
// sign, a space, anything but 1 to 19 ASCII digits) is ignored: the request
// is served with the deadline it had. A budget above a day is clamped to a
// day. A budget only ever shortens the request's deadline: it is set with
// context.WithTimeout on the request's context, so a deadline that the
// server or its own caller set earlier stays when it is the sooner one. An
// attempt header that is absent or malformed (not 1 to 1000) makes the
// request a first attempt.
package server

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/contract"
)

// New returns next behind the contract. An invalid option gives an error
// that names it. The handler is safe for concurrent use and starts no
// goroutine.
func New(next http.Handler, o Options) (http.Handler, error) {
	if next == nil {
		return nil, errors.New("resilience: server: nil next handler")
	}
	o, err := o.resolve()
	if err != nil {
		return nil, err
	}
	h := &handler{
		next:      next,
		budget:    o.Headers.Budget,
		attempt:   o.Headers.Attempt,
		pushback:  o.Headers.Pushback,
		minBudget: o.MinBudget,
		limit:     int64(o.MaxConcurrent),
		onEvent:   o.OnEvent,
	}
	if o.MaxConcurrent > 0 {
		h.reserve = min(max(1, h.limit/10), h.limit-1)
	}
	if o.RetryShare >= 0 {
		h.share = o.RetryShare
		h.win = newWindow(o.Window)
	}
	return h, nil
}

type handler struct {
	next                      http.Handler
	budget, attempt, pushback string        // canonical field names
	minBudget                 time.Duration // budgets under it are refused; 0 refuses only a spent one
	limit, reserve            int64         // MaxConcurrent and the slots kept for first attempts
	share                     float64       // RetryShare; unused when win is nil
	win                       *window       // nil: no share is kept
	onEvent                   func(Event)
	inflight                  atomic.Int64
}

// The headers are looked up by their canonical names alone: net/http's
// server canonicalizes every field name that is a token, as these are.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	budget, hasBudget := contract.ParseBudget(r.Header[h.budget])
	attempt, _ := contract.ParseAttempt(r.Header[h.attempt])
	retry := attempt > 1
	if hasBudget && (budget == 0 || budget < h.minBudget) {
		h.refuse(w, Event{Kind: EventExpired, Attempt: attempt, Budget: budget, Stop: true})
		return
	}
	if !h.acquire(retry) {
		h.refuse(w, Event{Kind: EventOverloaded, Attempt: attempt, Budget: budget, Stop: retry})
		return
	}
	if h.win != nil {
		if ok, s := h.win.admit(retry, h.share); !ok {
			h.inflight.Add(-1)
			h.refuse(w, Event{Kind: EventRetryRefused, Attempt: attempt, Budget: budget, Share: s, Stop: true})
			return
		}
	}
	defer h.inflight.Add(-1)
	if hasBudget {
		ctx, cancel := context.WithTimeout(r.Context(), budget)
		defer cancel()
		r = r.WithContext(ctx)
	}
	h.next.ServeHTTP(w, r)
}

// acquire takes a slot of MaxConcurrent for a request, less the reserve
// for a retry, and reports whether there was one.
func (h *handler) acquire(retry bool) bool {
	if h.limit == 0 {
		h.inflight.Add(1)
		return true
	}
	limit := h.limit
	if retry {
		limit -= h.reserve
	}
	for {
		n := h.inflight.Load()
		if n >= limit {
			return false
		}
		if h.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

var refusalText = [...]string{
	EventExpired:      "budget spent",
	EventRetryRefused: "too many retries",
	EventOverloaded:   "overloaded",
}

// refuse answers 503, with the pushback stop if e.Stop, and reports e.
func (h *handler) refuse(w http.ResponseWriter, e Event) {
	if e.Stop {
		w.Header().Set(h.pushback, contract.PushbackStop)
	}
	text := refusalText[e.Kind]
	if e.Kind == EventExpired && e.Budget > 0 {
		text = "budget under the server's floor"
	}
	http.Error(w, "resilience: server: "+text, http.StatusServiceUnavailable)
	if h.onEvent != nil {
		if e.Kind != EventRetryRefused && h.win != nil {
			e.Share = h.win.share()
		}
		e.InFlight = int(h.inflight.Load())
		h.onEvent(e)
	}
}
