package resilience

import (
	"reflect"
	"slices"
)

// Live configuration: a running Handler takes new Options without losing
// what it holds. Every call loads the handler's options once, when it
// starts (roundTrip), and reads only that snapshot to its end; the state
// the calls share (hostState's policies, the retry budget) is changed in
// place where it can be, and replaced, carrying its state, where
// failsafe-go's primitives are fixed when built.

// Options returns the options the handler runs with, defaults filled in: to
// change one field, change it in them and pass them to Update, which keeps
// a default the fields left as they were.
func (h *Handler) Options() Options {
	o := h.cfg.Load().Options
	o.Retry.Methods = slices.Clone(o.Retry.Methods)
	o.Retry.ExcludeMethods = slices.Clone(o.Retry.ExcludeMethods)
	o.Endpoints = slices.Clone(o.Endpoints)
	return o
}

// Update replaces the handler's options with opts, validated as NewHandler
// does; an invalid value, another Name (an empty one keeps it) or another
// PerHost.Enabled is an error that changes nothing. A field of opts that
// holds the default the handler runs with, as Options returns it, stays a
// default, and yields to the fields changed as NewHandler's defaults do:
// with the defaults, an AttemptTimeout changed to 40s raises the total
// timeout to 2m rather than contradict its 30s. Calls in flight keep their
// options; the handler keeps its circuit, hosts, budget, permits and kept
// responses (docs/configuration.md). Do not call it from OnEvent or Logger.
func (h *Handler) Update(opts Options) error {
	cur := h.cfg.Load()
	keepDefaults(reflect.ValueOf(&opts).Elem(), reflect.ValueOf(cur.given), reflect.ValueOf(cur.Options))
	cfg, err := h.prepare(opts)
	if err != nil {
		return err
	}
	h.commit(cfg)
	return nil
}

// keepDefaults sets back to zero, its default, each field of opts that was
// a default in the options given (zero there) and still holds the value
// it was resolved to. Slices, maps, functions and interfaces are the
// caller's as written; no default fills them in.
func keepDefaults(opts, given, resolved reflect.Value) {
	switch opts.Kind() {
	case reflect.Struct:
		for i := range opts.NumField() {
			if opts.Type().Field(i).IsExported() {
				keepDefaults(opts.Field(i), given.Field(i), resolved.Field(i))
			}
		}
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.String:
		if given.IsZero() && opts.Equal(resolved) {
			opts.SetZero()
		}
	}
}

// prepare resolves opts for h and checks that h can take them, changing
// nothing.
func (h *Handler) prepare(opts Options) (*config, error) {
	cur := h.cfg.Load() // its Name and PerHost.Enabled never change
	if opts.Name == "" {
		opts.Name = cur.Name
	}
	if opts.Name != cur.Name {
		return nil, &optionError{handler: cur.Name, field: "Name", value: opts.Name,
			reason: "cannot change on a running handler"}
	}
	cfg, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if cfg.PerHost.Enabled != cur.PerHost.Enabled {
		return nil, &optionError{handler: cur.Name, field: "PerHost.Enabled", value: cfg.PerHost.Enabled,
			reason: "cannot change on a running handler, whose circuit and limits are one for all hosts or one per host; build a new Handler"}
	}
	return cfg, nil
}

// commit makes cfg, prepared, the handler's options.
func (h *Handler) commit(cfg *config) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The options first: a host met from here on is built from them, and a
	// host built from the old ones is in the table before hosts.all runs.
	h.cfg.Store(cfg)
	rb := cfg.RetryBudget
	h.budget.Set(rb.MaxTokens, rb.TokenRatio, rb.RetrySuccessTokens)
	h.fbStore.resize(cfg.Fallback.MaxBytes)
	if h.shared != nil {
		h.shared.reconfigure(cfg)
	}
	t := h.hosts
	t.mu.Lock()
	t.max, t.idleAfter = cfg.PerHost.MaxHosts, cfg.PerHost.IdleTimeout
	t.mu.Unlock()
	for _, s := range t.all() {
		s.reconfigure(cfg)
	}
}

// reconfigure gives s the policies and the circuit breaker cfg describes,
// keeping those cfg does not change. h.mu must be held.
func (s *hostState) reconfigure(cfg *config) {
	s.circuit.Reconfigure(breakerOptionsOf(cfg)) // keeps the circuit's state
	old := s.policies.Load()
	if sameRateOptions(cfg.RateLimit, old.rl) && cfg.Overload == old.ov {
		return // a host met after the update, or nothing of its own changed
	}
	s.policies.Store(newPolicies(cfg, old))
}
