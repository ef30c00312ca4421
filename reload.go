package resilience

import (
	"fmt"
	"reflect"
	"sort"
)

// Changes is what Handlers.Apply did. Removed upstreams' handlers keep
// running; Changed lists fields a file can hold, in the order of Options.
type Changes struct {
	Added   []string            // upstreams new in the configuration, sorted
	Removed []string            // upstreams no longer in it, sorted
	Changed map[string][]string // by upstream, fields changed: "retry.delay"
}

// Apply validates c's upstreams as Handler.Update does, then updates those
// kept, adds the new and drops the rest from hs; an error changes nothing.
// configure is as for Config.Handlers. It is safe for concurrent use.
func (hs *Handlers) Apply(c Config, configure func(name string, o *Options)) (Changes, error) {
	if len(c.Upstreams) == 0 {
		return Changes{}, fmt.Errorf("resilience: config: no upstream is configured")
	}
	hs.apply.Lock()
	defer hs.apply.Unlock()
	hs.mu.RLock()
	running := hs.byName // replaced, never changed in place
	hs.mu.RUnlock()

	type update struct {
		h   *Handler
		cfg *config
	}
	var updates []update
	var ch Changes
	byName := make(map[string]*Handler, len(c.Upstreams))
	names := sortedKeys(c.Upstreams)
	for _, name := range names {
		o := c.Upstreams[name]
		o.Name = name
		if configure != nil {
			configure(name, &o)
		}
		h, ok := running[name]
		if !ok {
			nh, err := NewHandler(o) // nothing sees it before it is published below
			if err != nil {
				return Changes{}, fmt.Errorf("resilience: config: upstreams.%s: %w", name, err)
			}
			byName[name] = nh
			ch.Added = append(ch.Added, name)
			continue
		}
		cfg, err := h.prepare(o)
		if err != nil {
			return Changes{}, fmt.Errorf("resilience: config: upstreams.%s: %w", name, err)
		}
		if fields := changedFields(h.cfg.Load(), cfg); len(fields) > 0 {
			if ch.Changed == nil {
				ch.Changed = make(map[string][]string)
			}
			ch.Changed[name] = fields
		}
		byName[name] = h
		updates = append(updates, update{h, cfg})
	}
	for name := range running {
		if _, ok := byName[name]; !ok {
			ch.Removed = append(ch.Removed, name)
		}
	}
	sort.Strings(ch.Removed)

	// Everything is valid: from here on nothing fails.
	for _, u := range updates {
		u.h.commit(u.cfg)
	}
	hs.mu.Lock()
	hs.byName, hs.names = byName, names
	hs.mu.Unlock()
	return ch, nil
}

// changedFields returns the data fields of Options that differ between a
// and b, both resolved, by their names in a configuration file. Name,
// functions and pointers are not compared.
func changedFields(a, b *config) []string {
	var out []string
	diffFields(reflect.ValueOf(a.Options), reflect.ValueOf(b.Options), "", &out)
	return out
}

func diffFields(a, b reflect.Value, path string, out *[]string) {
	switch a.Kind() {
	case reflect.Struct:
		for i := 0; i < a.NumField(); i++ {
			f := a.Type().Field(i)
			if !f.IsExported() || (path == "" && f.Name == "Name") {
				continue
			}
			p := f.Name
			if path != "" {
				p = path + "." + f.Name
			}
			diffFields(a.Field(i), b.Field(i), p, out)
		}
	case reflect.Func, reflect.Pointer, reflect.Interface, reflect.Chan, reflect.UnsafePointer:
		// Set by code, not by a file: not compared.
	case reflect.Slice, reflect.Map:
		if (a.Len() != 0 || b.Len() != 0) && !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, jsonPath(path))
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, jsonPath(path))
		}
	}
}
