package bench

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"

	"github.com/resilienthttp/resilience"
)

// The overload experiment's clients (issue 19). Each is built over the
// experiment's base (ovlBase over a fresh loopback transport); every call
// also carries the caller's deadline, ovlCallerDeadline. Durations are the
// faults experiment's scaled ones (faults_test.go): attempt timeout 200ms,
// total 2s, retry waits 20ms to 200ms, 3 retries.
//
// Where the adaptive peers sit: failsafe-go's adaptivelimiter is measured
// twice, alone over the bare transport (no retries: the limiter as is) and
// per attempt inside the handler's defaults (the handler's retries run
// around it, so a rejected attempt is a transient error that the handler
// retries after its backoff). The two throttles (failsafe-go's
// adaptivethrottler, the SRE throttle) gate attempts inside the handler's
// defaults, where the SRE book puts client-side throttling: it counts every
// request the client wants to send, retries included.
type ovlClient struct {
	name string
	doc  string // one line for the report
	new  func(base http.RoundTripper, seed uint64) (*http.Client, error)
}

// ovlClients is the constructor list: the clients run one after another,
// in this order, on the same seeded traffic.
var ovlClients = []ovlClient{
	{"bare", "http.Client, Timeout 2s, no retries", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return faultPeerByName("bare").new(base, new(atomic.Int64))
	}},
	{"retryablehttp", "go-retryablehttp, 4 attempts, waits 20-200ms, 200ms per attempt (the faults experiment's)", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return faultPeerByName("retryablehttp").new(base, new(atomic.Int64))
	}},
	{"failsafehttp", "failsafehttp: bulkhead, timeout 2s, 3 retries, breaker 0.1 of 100, timeout 200ms (the faults experiment's)", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return faultPeerByName("failsafehttp").new(base, new(atomic.Int64))
	}},
	// the handler's defaults as they ship (the overload limiter on),
	// scaled as in the do-no-harm experiment
	{"resilience", "the handler's defaults, scaled (dnhOptions; the overload limiter on, MaxQueueWait 67ms)", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		t, err := resilience.NewTransport(base, dnhOptions())
		if err != nil {
			return nil, err
		}
		return &http.Client{Transport: t}, nil
	}},
	{"adaptivelimiter", "failsafe-go adaptivelimiter, its defaults, alone over the bare transport: no retries", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return &http.Client{Transport: newOVLLimited(base), Timeout: faultTotalTimeout}, nil
	}},
	{"resilience+adaptivelimiter", "the handler's defaults (limiter off) with failsafe-go adaptivelimiter gating each attempt (its retries around it)", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return ovlHandler(newOVLLimited(base))
	}},
	{"resilience+adaptivethrottler", "the handler's defaults (limiter off) with failsafe-go adaptivethrottler (defaults) gating each attempt", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return ovlHandler(newOVLThrottled(base))
	}},
	{"resilience+sre", "the handler's defaults (limiter off) with the SRE throttle (K=2, 2 min window) gating each attempt", func(base http.RoundTripper, seed uint64) (*http.Client, error) {
		return ovlHandler(newSREThrottle(base, sreK, sreWindow, seed))
	}},

	// the handler's defaults before issue 19: the limiter off
	{"resilience (limiter off)", "the handler's defaults with Overload.Disabled (before issue 19)", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		return ovlHandler(base)
	}},
	// the shipped limiter with its unscaled queue wait, 1 s: half the
	// caller's 2 s deadline (a queue as long as the deadline allows)
	{"resilience (queue 1s)", "the handler's defaults with Overload.MaxQueueWait 1s, unscaled", func(base http.RoundTripper, _ uint64) (*http.Client, error) {
		o := dnhOptions()
		o.Overload.MaxQueueWait = shipped().Overload.MaxQueueWait
		t, err := resilience.NewTransport(base, o)
		if err != nil {
			return nil, err
		}
		return &http.Client{Transport: t}, nil
	}},
}

func faultPeerByName(name string) faultPeer {
	for _, p := range faultPeers {
		if p.name == name {
			return p
		}
	}
	panic("no fault peer " + name)
}

// ovlHandler is the standard handler with the do-no-harm experiment's
// scaled defaults (dnhOptions) and its own overload limiter off, over base:
// the handler around a peer limiter, and the defaults before issue 19.
func ovlHandler(base http.RoundTripper) (*http.Client, error) {
	o := dnhOptions()
	o.Overload.Disabled = true
	t, err := resilience.NewTransport(base, o)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// ovlLimited puts failsafe-go's adaptivelimiter (v0.9.8, its defaults:
// limits 1/200/20, p90 of a recent window of 1-30 s and ≥ 50 samples
// against a baseline of age 10, no queueing) in front of base, by hand as
// failsafe-go's own executor does: TryAcquirePermit, and when full the
// attempt fails at once with adaptivelimiter.ErrExceeded; a round trip that
// returned records its duration (success or error), one whose request
// context ended (the caller or an attempt timeout gave up) is dropped, as
// the executor drops canceled executions.
type ovlLimited struct {
	base    http.RoundTripper
	limiter adaptivelimiter.AdaptiveLimiter[*http.Response]
}

func newOVLLimited(base http.RoundTripper) ovlLimited {
	return ovlLimited{base: base, limiter: adaptivelimiter.NewWithDefaults[*http.Response]()}
}

func (l ovlLimited) RoundTrip(req *http.Request) (*http.Response, error) {
	p, ok := l.limiter.TryAcquirePermit()
	if !ok {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, adaptivelimiter.ErrExceeded
	}
	resp, err := l.base.RoundTrip(req)
	if req.Context().Err() != nil {
		p.Drop()
	} else {
		p.Record()
	}
	return resp, err
}

// ovlThrottled puts failsafe-go's adaptivethrottler (v0.9.8, its defaults:
// reject once successes fall under 90% of executions over 1 minute, at most
// 90% rejected) in front of base: TryAcquirePermit, then the outcome as the
// handler classifies it (resilience.IsTransient is a failure).
type ovlThrottled struct {
	base      http.RoundTripper
	throttler adaptivethrottler.AdaptiveThrottler[*http.Response]
}

func newOVLThrottled(base http.RoundTripper) ovlThrottled {
	return ovlThrottled{base: base, throttler: adaptivethrottler.NewBuilder[*http.Response]().
		HandleIf(resilience.IsTransient).Build()}
}

func (t ovlThrottled) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.throttler.TryAcquirePermit() {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, adaptivethrottler.ErrExceeded
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		t.throttler.RecordError(err)
	} else {
		t.throttler.RecordResult(resp)
	}
	return resp, err
}

// The SRE throttle's parameters: K = 2 (the book's suggestion) over a
// sliding window of 2 minutes (the book's; not scaled: it is the mechanism's
// memory, and it is why it recovers slowly).
const (
	sreK      = 2.0
	sreWindow = 2 * time.Minute
)

// errSREThrottled is the SRE throttle's local rejection.
var errSREThrottled = errors.New("bench: rejected locally by the SRE throttle")

// sreThrottle is adaptive client-side throttling as the Google SRE book
// describes it ("Handling Overload"): over a sliding window the client
// counts requests (every attempt it wanted to send, the ones it rejected
// itself included) and accepts (attempts the backend accepted), and rejects
// a new attempt locally with probability max(0, (requests − K·accepts) /
// (requests + 1)). An accept is any response but 429 and 503; errors and
// timeouts are not accepts. The window is 120 buckets of window/120; the
// random draws come from a PCG generator seeded with the run's seed.
type sreThrottle struct {
	base   http.RoundTripper
	k      float64
	bucket time.Duration

	mu       sync.Mutex
	rng      *rand.Rand
	epoch    time.Time
	slot     []int64 // the bucket number each ring slot counts
	requests []float64
	accepts  []float64
}

const sreBuckets = 120

func newSREThrottle(base http.RoundTripper, k float64, window time.Duration, seed uint64) *sreThrottle {
	return &sreThrottle{
		base:     base,
		k:        k,
		bucket:   window / sreBuckets,
		rng:      rand.New(rand.NewPCG(seed, 0x5e_7407_71e)),
		epoch:    time.Now(),
		slot:     make([]int64, sreBuckets),
		requests: make([]float64, sreBuckets),
		accepts:  make([]float64, sreBuckets),
	}
}

// current returns the ring index of now's bucket, clearing it if it last
// counted an older bucket. Called with mu held.
func (s *sreThrottle) current(now time.Time) int {
	n := int64(now.Sub(s.epoch) / s.bucket)
	i := int(n % sreBuckets)
	if s.slot[i] != n {
		s.slot[i], s.requests[i], s.accepts[i] = n, 0, 0
	}
	return i
}

// sums are the window's requests and accepts. Called with mu held.
func (s *sreThrottle) sums(now time.Time) (req, acc float64) {
	n := int64(now.Sub(s.epoch) / s.bucket)
	for i := range sreBuckets {
		if n-s.slot[i] < sreBuckets {
			req += s.requests[i]
			acc += s.accepts[i]
		}
	}
	return req, acc
}

func (s *sreThrottle) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	s.mu.Lock()
	i := s.current(now)
	r, a := s.sums(now)
	p := max(0, (r-s.k*a)/(r+1))
	s.requests[i]++
	reject := p > 0 && s.rng.Float64() < p
	s.mu.Unlock()
	if reject {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errSREThrottled
	}
	resp, err := s.base.RoundTrip(req)
	if err == nil && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		now := time.Now()
		s.mu.Lock()
		s.accepts[s.current(now)]++
		s.mu.Unlock()
	}
	return resp, err
}
