package resilience

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
)

// A hostState is what one upstream keeps between calls: its circuit
// breaker, its concurrency and rate limits, and the failures that explain
// an open circuit. A Handler has one, or one per authority with PerHost.
type hostState struct {
	h    *Handler
	host string // the authority, with PerHost; "" otherwise

	breaker  circuitbreaker.CircuitBreaker[any] // nil when disabled
	bulkhead bulkhead.Bulkhead[any]             // nil when disabled
	limiter  ratelimiter.RateLimiter[any]       // nil without a rate
	queued   atomic.Int64                       // calls waiting for a bulkhead permit
	circuit  atomic.Int32                       // CircuitState as the breaker's listeners last saw it
	failures failureLog
	lastUsed atomic.Int64 // unix nanoseconds, with PerHost
	probe    probeGate    // the half-open circuit's probe
}

func newHostState(h *Handler, host string) *hostState {
	s := &hostState{h: h, host: host}
	cfg := h.cfg
	if rl := cfg.RateLimit; !rl.Disabled {
		s.bulkhead = bulkhead.New[any](uint(rl.MaxConcurrent))
		if rl.RequestsPerSecond > 0 {
			s.limiter = newRateLimiter(rl.RequestsPerSecond, rl.Burst)
		}
	}
	if cb := cfg.CircuitBreaker; !cb.Disabled {
		s.breaker = circuitbreaker.NewBuilder[any]().
			WithFailureRateThreshold(cb.FailureRatio, uint(cb.MinimumThroughput), cb.SamplingDuration).
			WithDelay(cb.BreakDuration).
			WithSuccessThreshold(1). // half-open admits one probe, as Polly does
			OnOpen(s.onOpen).
			OnHalfOpen(s.onHalfOpen).
			OnClose(s.onClose).
			Build()
	}
	return s
}

// newRateLimiter spaces calls evenly at rps, or lets burst calls through
// per burst/rps period.
func newRateLimiter(rps float64, burst int) ratelimiter.RateLimiter[any] {
	interval := time.Duration(float64(time.Second) / rps)
	if burst <= 1 {
		return ratelimiter.NewSmoothWithMaxRate[any](interval)
	}
	return ratelimiter.NewBursty[any](uint(burst), interval*time.Duration(burst))
}

func (s *hostState) circuitState() CircuitState {
	if s.breaker == nil {
		return CircuitClosed
	}
	switch s.breaker.State() {
	case circuitbreaker.OpenState:
		if s.breaker.RemainingDelay() <= 0 {
			return CircuitHalfOpen
		}
		return CircuitOpen
	case circuitbreaker.HalfOpenState:
		return CircuitHalfOpen
	}
	return CircuitClosed
}

func (s *hostState) onOpen(e circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitOpen))
	if s.probe.quiet.Load() {
		return // a new probe is being let through: not a new opening
	}
	summary := "the half-open probe failed"
	if e.OldState == circuitbreaker.ClosedState {
		// Not e.Metrics(): it reads the old state's statistics without the
		// breaker's lock while attempts in flight record into them. The open
		// state holds the same statistics, and the breaker locks.
		m := s.breaker.Metrics()
		summary = fmt.Sprintf("%d of %d attempts failed", m.Failures(), m.Executions())
	}
	reason := s.failures.opened(summary)
	s.h.emit(Event{Kind: EventCircuitOpened, Host: s.host, Err: reason})
}

func (s *hostState) onHalfOpen(circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitHalfOpen))
	if s.probe.quiet.Load() {
		return
	}
	s.h.emit(Event{Kind: EventCircuitHalfOpened, Host: s.host})
}

func (s *hostState) onClose(circuitbreaker.StateChangedEvent) {
	s.circuit.Store(int32(CircuitClosed))
	s.failures.reset() // a closed circuit counts afresh, and so explains afresh
	s.h.emit(Event{Kind: EventCircuitClosed, Host: s.host})
}

func (s *hostState) idle(cutoff int64) bool { return s.lastUsed.Load() < cutoff }

// A hostTable keeps a state per authority, bounded in number and forgetting
// the hosts it has not seen for a while. It starts no goroutine: it sweeps
// when it meets a new host.
type hostTable struct {
	h         *Handler
	max       int
	idleAfter time.Duration

	mu        sync.RWMutex
	m         map[hostKey]*hostState
	lastSweep time.Time
}

func newHostTable(h *Handler) *hostTable {
	return &hostTable{
		h:         h,
		max:       h.cfg.PerHost.MaxHosts,
		idleAfter: h.cfg.PerHost.IdleTimeout,
		m:         make(map[hostKey]*hostState),
	}
}

// A hostKey is an authority: scheme and host[:port], in lower case, without
// the scheme's default port. A struct of the URL's own strings, it costs no
// allocation for a URL already in that form.
type hostKey struct{ scheme, host string }

func keyOf(u *url.URL) hostKey {
	scheme, host := u.Scheme, u.Host
	switch {
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = host[:len(host)-3]
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = host[:len(host)-4]
	}
	if hasUpper(scheme) {
		scheme = strings.ToLower(scheme)
	}
	if hasUpper(host) {
		host = strings.ToLower(host)
	}
	return hostKey{scheme, host}
}

func (k hostKey) String() string { return k.scheme + "://" + k.host }

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// get returns the state of u's authority, making it if new.
func (t *hostTable) get(u *url.URL) *hostState {
	key := keyOf(u)
	now := time.Now()
	t.mu.RLock()
	s := t.m[key]
	t.mu.RUnlock()
	if s == nil {
		t.mu.Lock()
		if s = t.m[key]; s == nil {
			t.sweepLocked(now)
			s = newHostState(t.h, key.String())
			t.m[key] = s
		}
		t.mu.Unlock()
	}
	s.lastUsed.Store(now.UnixNano())
	return s
}

// sweepLocked forgets idle hosts, at most every idleAfter/4, and makes room
// for one more host by forgetting the least recently used. t.mu must be held.
func (t *hostTable) sweepLocked(now time.Time) {
	cutoff := now.Add(-t.idleAfter).UnixNano()
	if now.Sub(t.lastSweep) >= t.idleAfter/4 {
		t.lastSweep = now
		for k, s := range t.m {
			if s.idle(cutoff) {
				delete(t.m, k)
			}
		}
	}
	for len(t.m) >= t.max {
		var oldest hostKey
		at := int64(-1)
		for k, s := range t.m {
			if u := s.lastUsed.Load(); at < 0 || u < at {
				oldest, at = k, u
			}
		}
		delete(t.m, oldest)
	}
}

// all returns the states the table keeps.
func (t *hostTable) all() []*hostState {
	t.mu.RLock()
	defer t.mu.RUnlock()
	states := make([]*hostState, 0, len(t.m))
	for _, s := range t.m {
		states = append(states, s)
	}
	return states
}
