package resilience

import (
	"container/list"
	"context"
	"net/http"
	"sync"
	"time"
)

// A FallbackEntry is a response kept for the fallback layer or, with Vary
// set, the headers its URL's responses vary on. None may change once Put.
type FallbackEntry struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	Stored     time.Time // when the response was kept (its body read to EOF)
	Vary       []string
}

// Size is what the entry counts against a store's bound, in bytes.
func (e *FallbackEntry) Size() int64 {
	n := int64(cap(e.Body))
	for k, vs := range e.Header {
		n += int64(len(k)) + headerFieldOverhead
		for _, v := range vs {
			n += int64(len(v)) + headerValueOverhead
		}
	}
	for _, v := range e.Vary {
		n += int64(len(v))
	}
	return n
}

// What an entry holds beside the bytes of its body, names and values, on
// a 64-bit platform: a header's map slot for a name (its string and slice
// headers, and the slot's share of the map), a value's string header; and,
// counted by the built-in store for each entry beside its Size and its
// key, the FallbackEntry, its header's map and the store's own list
// element, item and index slot (measured: about 290 bytes on Go 1.26,
// amd64). Without them, a store of small responses held several times its
// bound.
const (
	headerFieldOverhead = 48
	headerValueOverhead = 16
	lruEntryOverhead    = 320
)

// A FallbackStore keeps the responses the fallback layer may serve, by key,
// and may forget any. It must be safe for concurrent use; Put and Get
// should return quickly, and must once their context is done. See
// docs/fallback.md.
type FallbackStore interface {
	Get(ctx context.Context, key string) (*FallbackEntry, bool)
	Put(ctx context.Context, key string, e *FallbackEntry)
}

// lruStore is the built-in FallbackStore: bounded in bytes (each entry's
// Size plus its key and lruEntryOverhead), least recently used first out,
// in O(1).
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

// Get returns the entry kept under key. It does not block: ctx is unused.
func (s *lruStore) Get(_ context.Context, key string) (*FallbackEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.items[key]
	if !ok {
		return nil, false
	}
	s.ll.MoveToFront(el)
	return el.Value.(*lruItem).e, true
}

// Put keeps e under key, forgetting the least recently used entries that
// no longer fit. It does not block: ctx is unused.
func (s *lruStore) Put(_ context.Context, key string, e *FallbackEntry) {
	size := e.Size() + int64(len(key)) + lruEntryOverhead
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
