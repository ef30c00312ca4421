package resilience

import (
	"container/list"
	"net/http"
	"sync"
	"time"
)

// A FallbackEntry is a response kept for the fallback layer. Entries are
// shared: neither a store nor its users may modify one once it is Put.
type FallbackEntry struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	Stored     time.Time // when the response was kept (its body read to EOF)

	// Vary, when not nil, marks an entry that holds no response: the kept
	// responses for this URL vary on these request headers, and each is
	// stored under its own key.
	Vary []string
}

// Size is what the entry counts against a store's bound: its body's
// buffer (its capacity, which is what it holds, not its length) and its
// header's names and values.
func (e *FallbackEntry) Size() int64 {
	n := int64(cap(e.Body))
	for k, vs := range e.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v))
		}
	}
	for _, v := range e.Vary {
		n += int64(len(v))
	}
	return n
}

// A FallbackStore keeps the responses the fallback layer may serve, by key.
// It must be safe for concurrent use. Get and Put are called on the
// caller's goroutine, Put when a kept response's body reaches EOF, Get
// when a call fails: both should return quickly. A store may forget any
// entry at any time.
type FallbackStore interface {
	Get(key string) (*FallbackEntry, bool)
	Put(key string, e *FallbackEntry)
}

// lruStore is the built-in FallbackStore: bounded in bytes (each entry's
// Size plus its key), least recently used first out, in O(1).
type lruStore struct {
	mu    sync.Mutex
	max   int64 // the bound in bytes
	size  int64 // the bytes held
	ll    *list.List
	items map[string]*list.Element
}

type lruItem struct {
	key  string
	e    *FallbackEntry
	size int64
}

func newLRUStore(maxBytes int64) *lruStore {
	return &lruStore{max: maxBytes, ll: list.New(), items: make(map[string]*list.Element)}
}

func (s *lruStore) Get(key string) (*FallbackEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.items[key]
	if !ok {
		return nil, false
	}
	s.ll.MoveToFront(el)
	return el.Value.(*lruItem).e, true
}

func (s *lruStore) Put(key string, e *FallbackEntry) {
	size := e.Size() + int64(len(key))
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.items[key]; ok {
		s.removeLocked(el)
	}
	if size > s.max {
		return // larger than the whole store: not kept
	}
	s.items[key] = s.ll.PushFront(&lruItem{key: key, e: e, size: size})
	s.size += size
	s.evictLocked()
}

// resize sets the bound, evicting what no longer fits.
func (s *lruStore) resize(maxBytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max = maxBytes
	s.evictLocked()
}

func (s *lruStore) evictLocked() {
	for s.size > s.max {
		s.removeLocked(s.ll.Back())
	}
}

func (s *lruStore) removeLocked(el *list.Element) {
	it := s.ll.Remove(el).(*lruItem)
	delete(s.items, it.key)
	s.size -= it.size
}

// bytes returns the bytes held, for tests.
func (s *lruStore) bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}
