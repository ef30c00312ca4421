package resilience

import (
	"net/url"
	"strings"
	"sync"
	"time"
)

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
