// Package resiliencetest injects faults into HTTP clients under test: what
// Polly's chaos strategies and WireMock give .NET users, for Go tests.
//
// A Script hands out one Fault per request, in the order requests arrive:
// a fixed Sequence, a seeded random Mix, or any function of the request
// number (Func). The same Script can drive a Transport, which injects the
// faults in front of (or instead of) a base http.RoundTripper without a
// network, or a Server, an httptest-based upstream on loopback that plays
// the faults on the wire and counts requests and new TCP connections.
//
// Everything is deterministic for a given script: a Mix with the same seed
// hands out the same faults in the same order.
package resiliencetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"
)

// A Fault is one scripted outcome of a request. The zero Fault is a healthy
// 200 OK with an empty body (or, for a Transport with a base, the base's own
// response). The fields combine in this order: first Delay, then Hang,
// Reset or Err (the first one set wins), otherwise a response with Status,
// RetryAfter and Body.
type Fault struct {
	// Status is the response's status code; 0 means 200.
	Status int

	// RetryAfter, when set, is sent as the Retry-After header, as is:
	// delta-seconds ("1") or an HTTP-date.
	RetryAfter string

	// Body is the response body. It is shared, not copied: do not modify
	// it once the Fault is in a Script.
	Body []byte

	// Delay is latency added before the outcome. It honours the request's
	// context: a request that gives up during the delay ends then.
	Delay time.Duration

	// Hang never answers: the request waits until its context is done (the
	// client gave up) or, on a Server, until the Server is closed.
	Hang bool

	// Reset drops the connection abruptly: a Server sends a TCP RST, a
	// Transport returns a *net.OpError wrapping syscall.ECONNRESET.
	Reset bool

	// Err is the error a Transport returns. A Server cannot send an error,
	// so it resets the connection instead.
	Err error
}

// A Weighted is one choice of a Mix: Fault, drawn with a probability
// proportional to Weight.
type Weighted struct {
	Weight float64
	Fault  Fault
}

// A Script hands out one Fault per request, in request order. It is safe
// for concurrent use; a Script shared by several Transports or Servers hands
// out a single sequence among them. A nil *Script hands out zero Faults.
type Script struct {
	mu   sync.Mutex
	n    int
	next func(n int) Fault
}

// Sequence returns a Script that hands out faults in order, then repeats the
// last one for every further request. Sequence() hands out zero Faults.
// For a pattern that cycles, use Func:
//
//	Func(func(n int) Fault { return faults[n%len(faults)] })
func Sequence(faults ...Fault) *Script {
	faults = slices.Clone(faults)
	return Func(func(n int) Fault {
		if len(faults) == 0 {
			return Fault{}
		}
		return faults[min(n, len(faults)-1)]
	})
}

// Mix returns a Script that draws each fault at random from choices, with
// probabilities proportional to their weights, from a PCG generator seeded
// with seed: the same seed and choices give the same faults in the same
// order. Mix panics if a weight is negative, NaN or infinite, or if none is
// positive.
func Mix(seed uint64, choices ...Weighted) *Script {
	cum := make([]float64, len(choices)) // cumulative weights
	total := 0.0
	for i, c := range choices {
		if c.Weight < 0 || math.IsNaN(c.Weight) || math.IsInf(c.Weight, 0) {
			panic(fmt.Sprintf("resiliencetest: Mix: weight %d is %v; want a finite number, zero or more", i, c.Weight))
		}
		total += c.Weight
		cum[i] = total
	}
	if total <= 0 || math.IsInf(total, 0) {
		panic(fmt.Sprintf("resiliencetest: Mix: the weights add up to %v; want a finite positive sum", total))
	}
	faults := make([]Fault, len(choices))
	for i, c := range choices {
		faults[i] = c.Fault
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	return Func(func(int) Fault {
		x := rng.Float64() * total
		i := sort.Search(len(cum), func(i int) bool { return cum[i] > x })
		return faults[min(i, len(faults)-1)]
	})
}

// Func returns a Script that hands out f(0), f(1), f(2), ... : f gets the
// number of the request, counting from 0 in arrival order. f is called with
// the Script's lock held, one call at a time, so it needs no locking of its
// own; it must not call Next on the same Script, but may on others, which
// makes scripts composable (say, a Mix with an outage window).
// Func panics if f is nil.
func Func(f func(n int) Fault) *Script {
	if f == nil {
		panic("resiliencetest: Func: nil function")
	}
	return &Script{next: f}
}

// Next hands out the Fault for the next request. Transports and Servers call
// it once per request; call it yourself to drive a handler of your own.
func (s *Script) Next() Fault {
	if s == nil {
		return Fault{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.next(s.n)
	s.n++
	return f
}
