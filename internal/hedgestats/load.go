package hedgestats

import (
	"sync"
	"sync/atomic"
	"time"
)

// The cap on hedging's extra load (Hedging.MaxExtraLoad): a hedge sent
// while an earlier attempt still runs is sent only while the hedges of the
// last loadWindow stay within that share of the hedged calls started in it,
// as Finagle's backup requests do (maxExtraLoad, its budget over 10s), plus
// one hedge per window (loadReserve), so that a handler that makes few
// calls, or has just been made, can still hedge: over a window of N calls
// the hedges are at most MaxExtraLoad*N+1, which is within one percentage
// point of the share from 100 calls a window.
// Calls are counted in loadSlots slots of loadWindow/loadSlots that take
// turns, so the window slides by one slot at a time.
//
// Counting a call is one atomic add. Claiming a hedge reads the slots under
// a mutex, so that calls deciding at the same moment cannot all take the
// last permitted hedge: the cap holds exactly within a window. Hedges are
// decided only when an attempt has outlived the delay, so the lock is taken
// by a few calls in a hundred.

const (
	loadWindow  = 10 * time.Second
	loadSlots   = 10
	loadReserve = 1 // hedges a window allows besides its share
)

// An ExtraLoad counts hedged calls and their hedges over a sliding
// window. Start sets its clock; the zero value is not started.
type ExtraLoad struct {
	epoch time.Time
	mu    sync.Mutex // serialises claims
	slots [loadSlots]loadSlot
}

type loadSlot struct {
	n      atomic.Int64 // the slot's number: time since epoch / (loadWindow/loadSlots)
	calls  atomic.Int64
	hedges atomic.Int64
}

// Start starts the window's clock at epoch.
func (w *ExtraLoad) Start(epoch time.Time) { w.epoch = epoch }

func (w *ExtraLoad) now() int64 {
	return int64(time.Since(w.epoch) / (loadWindow / loadSlots))
}

func (w *ExtraLoad) slot(n int64) *loadSlot {
	s := &w.slots[n%loadSlots]
	if old := s.n.Load(); old != n && s.n.CompareAndSwap(old, n) {
		s.calls.Store(0)
		s.hedges.Store(0)
	}
	return s
}

// Call counts a hedged call.
func (w *ExtraLoad) Call() { w.slot(w.now()).calls.Add(1) }

// Claim counts a hedge and reports true if one more keeps the hedges of the
// window within share of its calls, plus loadReserve; otherwise it counts
// nothing.
func (w *ExtraLoad) Claim(share float64) bool {
	n := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var calls, hedges int64
	for i := range w.slots {
		s := &w.slots[i]
		if m := s.n.Load(); m > n-loadSlots && m <= n {
			calls += s.calls.Load()
			hedges += s.hedges.Load()
		}
	}
	if float64(hedges+1) > share*float64(calls)+loadReserve+1e-9 {
		return false
	}
	w.slot(n).hedges.Add(1)
	return true
}
