package resilience

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// Handlers holds one Handler per named upstream, built together from a
// Config and updated by Apply. It is safe for concurrent use.
type Handlers struct {
	apply sync.Mutex // serialises Apply

	mu     sync.RWMutex // guards byName and names
	byName map[string]*Handler
	names  []string
}

// Handlers builds a Handler for every upstream of c. A non-nil configure is
// called first with each upstream's name and Options, to set what a file
// cannot hold, such as Logger, OnEvent, ShouldRetry or Shared.
func (c Config) Handlers(configure func(name string, o *Options)) (*Handlers, error) {
	if len(c.Upstreams) == 0 {
		return nil, fmt.Errorf("resilience: config: no upstream is configured")
	}
	hs := &Handlers{byName: make(map[string]*Handler, len(c.Upstreams))}
	for _, name := range sortedKeys(c.Upstreams) {
		o := c.Upstreams[name]
		o.Name = name
		if configure != nil {
			configure(name, &o)
		}
		h, err := NewHandler(o)
		if err != nil {
			return nil, fmt.Errorf("resilience: config: upstreams.%s: %w", name, err)
		}
		hs.byName[name] = h
		hs.names = append(hs.names, name)
	}
	return hs, nil
}

// Handler returns the named upstream's handler; an unknown name is an error.
func (hs *Handlers) Handler(name string) (*Handler, error) {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	if h, ok := hs.byName[name]; ok {
		return h, nil
	}
	return nil, fmt.Errorf("resilience: no upstream %q (known: %s)", name, strings.Join(hs.names, ", "))
}

// Transport returns the named upstream's Handler.Transport over base.
func (hs *Handlers) Transport(name string, base http.RoundTripper) (*Transport, error) {
	h, err := hs.Handler(name)
	if err != nil {
		return nil, err
	}
	return h.Transport(base), nil
}

// Names returns the upstreams' names, sorted.
func (hs *Handlers) Names() []string {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	return append([]string(nil), hs.names...)
}

// All returns every handler, sorted by name.
func (hs *Handlers) All() []*Handler {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	all := make([]*Handler, 0, len(hs.names))
	for _, n := range hs.names {
		all = append(all, hs.byName[n])
	}
	return all
}
