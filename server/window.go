package server

import (
	"sync"
	"time"
)

// The window counts the requests served (passed to the next handler) over
// the last Window, in windowBuckets buckets of Window/windowBuckets, and
// how many of them were retries. A refused request is counted in neither
// number: a refused retry that counted as retried would keep the share up
// by itself, and a client that retries its refusal (one that does not
// speak the contract) would keep every retry refused for as long as it
// tried. Counting what is served instead caps the retries served at about
// RetryShare of the requests served, and retries are served again as soon
// as first attempts make room for them.
type window struct {
	mu      sync.Mutex
	now     func() time.Time // time.Now; a test's clock
	start   time.Time
	width   time.Duration
	last    int64 // the latest tick seen: ticks never go back
	buckets [windowBuckets]bucket
}

const (
	windowBuckets     = 10
	minWindowRequests = 20 // served in the window before any retry is refused for the share
)

type bucket struct {
	tick           int64 // which tick's counts these are
	total, retried int64
}

func newWindow(span time.Duration) *window {
	return &window{now: time.Now, start: time.Now(), width: span / windowBuckets}
}

// tickLocked returns the current tick, never earlier than one seen before.
func (w *window) tickLocked() int64 {
	t := max(int64(w.now().Sub(w.start)/w.width), w.last)
	w.last = t
	return t
}

// sumLocked returns the counts of the window that ends at tick t.
func (w *window) sumLocked(t int64) (total, retried int64) {
	for i := range w.buckets {
		if b := &w.buckets[i]; b.tick > t-windowBuckets {
			total += b.total
			retried += b.retried
		}
	}
	return total, retried
}

func share(total, retried int64) float64 {
	if total == 0 {
		return 0
	}
	return float64(retried) / float64(total)
}

// admit decides whether a request may be served, as far as the share is
// concerned, and counts it if so: a retry is refused once at least
// minWindowRequests were served in the window and more than limit of them
// were retries. It returns the share the decision saw.
func (w *window) admit(retry bool, limit float64) (bool, float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tickLocked()
	total, retried := w.sumLocked(t)
	s := share(total, retried)
	if retry && total >= minWindowRequests && s > limit {
		return false, s
	}
	b := &w.buckets[t%windowBuckets]
	if b.tick != t {
		*b = bucket{tick: t}
	}
	b.total++
	if retry {
		b.retried++
	}
	return true, s
}

// share returns the retried share of the window now.
func (w *window) share() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return share(w.sumLocked(w.tickLocked()))
}
