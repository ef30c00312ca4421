package resilience

import (
	"container/list"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// A hostTable keeps a state per authority, bounded in number and forgetting
// the hosts idle for a while. It starts no goroutine: it forgets hosts when
// it meets a new one.
//
// A host is in use while calls to it are in flight (from get to release,
// which the call makes when it ends) and while its circuit refuses calls
// (open, its BreakDuration not over). A host in use is never forgotten: its
// next call would get a fresh state, with new limits while the old calls
// still run, or a closed circuit where the old one would refuse. Every other
// host is idle from the end of its last call. The idle hosts are forgotten
// IdleTimeout after that, and when the table is full, the least recently
// used of them makes room for a new host; if none is idle, the table grows
// past MaxHosts until one is.
//
// The idle hosts are kept in a container/list, in the order their last calls
// ended, least recent first: a doubly linked list moves a host to the back
// and takes one out of the middle in O(1), which a heap (O(log n), and keys
// that change while queued) or a ring (no removal from the middle) cannot.
// The list has a mutex of its own, lru, taken when a host's last call in
// flight ends, never when a call starts: a call to a known host costs a
// read-locked lookup and an atomic add, and its end an atomic add, plus the
// lock when no other call to the host is in flight. A host that becomes
// busy stays where it was in the list until forgetting reaches it, which
// takes it out (its release puts it back); a host whose circuit refuses
// calls is then set aside in a second list, in the same order, whose first
// host is looked at each time. Every other host looked at leaves the list it
// was in, so meeting a new host costs O(1) amortised, however many hosts
// are in use.
type hostTable struct {
	h     *Handler
	epoch time.Time // stamps are durations since, on the monotonic clock

	mu        sync.RWMutex // guards m, max and idleAfter; held for writing to add or forget a host
	m         map[hostKey]*hostState
	max       int           // PerHost.MaxHosts
	idleAfter time.Duration // PerHost.IdleTimeout

	lru  sync.Mutex // guards idle, held and hostEntry's other fields; taken after mu
	idle list.List  // *hostState, by the end of their last call, least recent first
	held list.List  // *hostState set aside while their circuit refused calls, in the same order
}

// A hostEntry is a hostState's place in its hostTable.
type hostEntry struct {
	inflight atomic.Int64 // calls from get to release; it drops to 0 only under lru

	key       hostKey
	elem      *list.Element // in idle or held (which is in), or nil
	in        *list.List
	idleSince int64 // when the last call ended; see hostTable.now
	gone      bool  // forgotten: never listed again
}

func newHostTable(h *Handler) *hostTable {
	return &hostTable{
		h:         h,
		max:       h.cfg.Load().PerHost.MaxHosts,
		idleAfter: h.cfg.Load().PerHost.IdleTimeout,
		epoch:     time.Now(),
		m:         make(map[hostKey]*hostState),
	}
}

// now is the time in nanoseconds since t was made, on the monotonic clock,
// so that a change of the wall clock changes no host's idleness.
func (t *hostTable) now() int64 { return int64(time.Since(t.epoch)) }

// get returns the state of u's authority, making it if new, and counts a
// call in flight to it until release.
func (t *hostTable) get(u *url.URL) *hostState {
	key := keyOf(u)
	t.mu.RLock()
	s := t.m[key]
	if s != nil {
		s.entry.inflight.Add(1) // under mu, so the host cannot be forgotten in between
	}
	t.mu.RUnlock()
	if s == nil {
		s = t.add(key)
	}
	return s
}

func (t *hostTable) add(key hostKey) *hostState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[key]; s != nil {
		s.entry.inflight.Add(1)
		return s
	}
	t.lru.Lock()
	t.makeRoomLocked(t.now())
	t.lru.Unlock()
	s := newHostState(t.h, key.String())
	s.entry.key = key
	s.entry.inflight.Store(1) // listed as idle when this call ends
	t.m[key] = s
	return s
}

// release ends a call counted by get. The last call in flight to a host
// makes it idle: it goes to the back of the idle list.
func (t *hostTable) release(s *hostState) {
	e := &s.entry
	for {
		n := e.inflight.Load()
		if n <= 1 {
			break
		}
		if e.inflight.CompareAndSwap(n, n-1) {
			return // other calls are in flight: the host stays busy
		}
	}
	now := t.now()
	t.lru.Lock()
	if e.inflight.Add(-1) == 0 && !e.gone {
		e.idleSince = now
		if e.in == &t.idle {
			t.idle.MoveToBack(e.elem)
		} else {
			t.unlistLocked(s)
			e.elem, e.in = t.idle.PushBack(s), &t.idle
		}
	}
	t.lru.Unlock()
}

// makeRoomLocked forgets the hosts idle for longer than idleAfter, then, if
// the table is full, the least recently used idle host. t.mu and t.lru must
// be held.
func (t *hostTable) makeRoomLocked(now int64) {
	cutoff := now - int64(t.idleAfter)
	for s := t.oldestLocked(); s != nil && s.entry.idleSince < cutoff; s = t.oldestLocked() {
		t.forgetLocked(s)
	}
	for len(t.m) >= t.max {
		s := t.oldestLocked()
		if s == nil {
			return // every host is in use: the table grows until one is idle
		}
		t.forgetLocked(s)
	}
}

// oldestLocked returns the least recently used host that may be forgotten,
// or nil if there is none. On its way it takes busy hosts out of the lists
// (their calls' release lists them again) and sets aside the hosts whose
// circuit refuses calls.
//
// The hosts set aside are looked at in the order they were set aside, and
// only the first: one whose circuit still refuses keeps those after it
// waiting, for at most a BreakDuration, which is the same for all of them.
func (t *hostTable) oldestLocked() *hostState {
	var oldest *hostState
	for e := t.idle.Front(); e != nil; e = t.idle.Front() {
		s := e.Value.(*hostState)
		if s.entry.inflight.Load() > 0 {
			t.unlistLocked(s)
			continue
		}
		if s.circuitHolds() {
			t.unlistLocked(s)
			s.entry.elem, s.entry.in = t.held.PushBack(s), &t.held
			continue
		}
		oldest = s
		break
	}
	for e := t.held.Front(); e != nil; e = t.held.Front() {
		s := e.Value.(*hostState)
		if s.entry.inflight.Load() > 0 {
			t.unlistLocked(s)
			continue
		}
		if !s.circuitHolds() && (oldest == nil || s.entry.idleSince < oldest.entry.idleSince) {
			oldest = s
		}
		break
	}
	return oldest
}

func (t *hostTable) forgetLocked(s *hostState) {
	t.unlistLocked(s)
	s.entry.gone = true
	delete(t.m, s.entry.key)
}

func (t *hostTable) unlistLocked(s *hostState) {
	if e := &s.entry; e.in != nil {
		e.in.Remove(e.elem)
		e.elem, e.in = nil, nil
	}
}

// circuitHolds reports whether s's circuit refuses calls for a while yet:
// open, its BreakDuration not over. Forgetting the host would let them
// through. A circuit whose BreakDuration is over lets its next call through
// as the probe, and a probe in flight is a call in flight, so neither holds
// the host; otherwise a host met once while it was failing, and never
// called again, would be kept for ever.
func (s *hostState) circuitHolds() bool { return s.circuitState() == CircuitOpen }

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
