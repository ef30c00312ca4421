package resilience

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/budget"
	"github.com/resilienthttp/resilience/internal/hedgestats"
)

// A Handler is the resilience stack of one upstream (not an http.Handler):
// the state its calls share. Share one among the upstream's clients through
// its Transport method. It is safe for concurrent use.
type Handler struct {
	cfg atomic.Pointer[config] // the current options; each call loads them once (live.go)
	mu  sync.Mutex             // serialises Update

	shared *hostState // the state of every call; nil with PerHost
	hosts  *hostTable // a state per authority; nil without PerHost

	budget   *budget.Budget // kept while RetryBudget.Disabled, so that Update can turn it on and off
	timers   timerSlots     // reused from call to call (deadline.go)
	isolated atomic.Bool
	epoch    time.Time // when it was made: attempts' send times are read against it

	// answeredSent is when the latest attempt to be served was sent, in
	// nanoseconds since epoch (answered, overtaken). It is the handler's,
	// not a host's or an endpoint's: a handler serves one upstream, and an
	// endpoint that answers nothing while its siblings answer later
	// attempts is stuck.
	answeredSent atomic.Int64

	fbStore *lruStore        // the built-in fallback store, bounded by the current Fallback.MaxBytes
	fbNow   func() time.Time // the fallback layer's clock, time.Now (tests set another)
	fbLate  atomic.Int64     // Gets of a plugged-in fallback store still running for callers that left (fallback.go)

	latency hedgestats.Sketch    // attempt latencies, for Hedging.DelayPercentile (internal/hedgestats)
	load    hedgestats.ExtraLoad // hedged calls and hedges, for Hedging.MaxExtraLoad (internal/hedgestats)
	rand    func(uint64) uint64  // the routing's random source, math/rand/v2's (tests set another)
	onHold  func()               // nil; tests set one to learn that an attempt was first held (deadlines.fire)
}

// NewHandler validates opts, fills in defaults, and returns the Handler
// they describe. An invalid option is an error that names the field.
func NewHandler(opts Options) (*Handler, error) {
	cfg, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	h := &Handler{}
	epoch := time.Now() // one clock for both windows
	h.epoch = epoch
	h.latency.Start(epoch)
	h.load.Start(epoch)
	h.cfg.Store(cfg)
	h.fbStore = newLRUStore(cfg.Fallback.MaxBytes)
	rb := cfg.RetryBudget
	h.budget = budget.New(rb.MaxTokens, rb.TokenRatio, rb.RetrySuccessTokens)
	h.rand, h.fbNow = rand.Uint64N, time.Now
	h.budget.OnChange = func(exhausted bool, why error) {
		// The budget is the handler's: the event names no host and no call.
		if exhausted {
			h.emit(Event{Kind: EventBudgetExhausted, Err: why})
		} else {
			h.emit(Event{Kind: EventBudgetRecovered})
		}
	}
	h.hosts = newHostTable(h) // each host's state with PerHost, each endpoint's in any case
	if !cfg.PerHost.Enabled {
		h.shared = newHostState(h, "")
	}
	return h, nil
}

// Name returns the handler's name, as used in errors, events and logs.
func (h *Handler) Name() string { return h.cfg.Load().Name }

// Transport returns a Transport through the handler to base, or to
// http.DefaultTransport if base is nil.
func (h *Handler) Transport(base http.RoundTripper) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{h: h, base: base}
}

// CircuitState is the state of a handler's circuit.
type CircuitState int32

// Circuit states, from the healthiest.
const (
	CircuitClosed   CircuitState = iota // calls flow; failures are counted
	CircuitHalfOpen                     // one probe is let through
	CircuitOpen                         // calls fail until BreakDuration ends
	CircuitIsolated                     // held open until CloseCircuit
)

func (s CircuitState) String() string {
	switch s {
	case CircuitClosed:
		return "closed"
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half-open"
	case CircuitIsolated:
		return "isolated"
	}
	return "unknown"
}

// CircuitState reports the state of the handler's circuit, the least healthy
// host's or endpoint's. Past BreakDuration, an open circuit is half-open.
func (h *Handler) CircuitState() CircuitState {
	if h.isolated.Load() {
		return CircuitIsolated
	}
	worst := CircuitClosed
	for _, s := range h.states() {
		worst = max(worst, s.circuitState())
	}
	return worst
}

// states returns every host state h keeps: the shared one, without
// PerHost, and those of the host table (each host's with PerHost, each
// endpoint's in any case).
func (h *Handler) states() []*hostState {
	states := h.hosts.all()
	if h.shared != nil {
		states = append(states, h.shared)
	}
	return states
}

// HostCircuitStates reports the circuit state of every host or endpoint
// the handler keeps, by authority (scheme://host:port); nil if it keeps none.
func (h *Handler) HostCircuitStates() map[string]CircuitState {
	hosts := h.hosts.all()
	if len(hosts) == 0 && h.shared != nil {
		return nil
	}
	isolated := h.isolated.Load()
	states := make(map[string]CircuitState, len(hosts))
	for _, s := range hosts {
		if isolated {
			states[s.host] = CircuitIsolated
		} else {
			states[s.host] = s.circuitState()
		}
	}
	return states
}

// IsolateCircuit holds the circuit open (every host's, with PerHost) until
// CloseCircuit, even with the circuit breaker disabled.
func (h *Handler) IsolateCircuit() {
	if !h.isolated.Swap(true) {
		h.emit(Event{Kind: EventCircuitOpened, Err: ErrIsolated})
	}
}

// CloseCircuit ends an isolation and closes the circuit (every host's,
// with PerHost), forgetting the failures counted so far.
func (h *Handler) CloseCircuit() {
	wasIsolated := h.isolated.Swap(false)
	closed := false
	for _, s := range h.states() {
		if s.circuit.Close() {
			closed = true
		}
	}
	if wasIsolated && !closed {
		h.emit(Event{Kind: EventCircuitClosed})
	}
}

// stateFor returns the state that governs req.
func (h *Handler) stateFor(req *http.Request) *hostState {
	if h.shared != nil {
		return h.shared
	}
	return h.hosts.get(req.URL)
}

// answered notes that an attempt sent at sent (since epoch) was served: a
// response the retry layer accepts, not a refusal it would retry. Two attempts answered at once may leave the earlier
// send time: overtaken learns of the later one from the next answer.
func (h *Handler) answered(sent time.Duration) {
	if int64(sent) > h.answeredSent.Load() {
		h.answeredSent.Store(int64(sent))
	}
}

// overtaken reports whether the upstream has served an attempt sent at
// or after at (since epoch): one still waiting that was sent before at is
// not queued behind that one, but stuck.
func (h *Handler) overtaken(at time.Duration) bool {
	return h.answeredSent.Load() >= int64(at)
}
