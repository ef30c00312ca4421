package resilience

import "time"

// Defaults of PerHostOptions: what a zero field means.
const (
	defaultMaxHosts        = 1000
	defaultHostIdleTimeout = 5 * time.Minute
)

// PerHostOptions configures per-host isolation: each authority
// (scheme://host:port) gets its own circuit breaker and limits.
type PerHostOptions struct {
	Enabled bool // turns it on; default false; Update cannot change it

	// MaxHosts is how many hosts are kept, more only while in use (a call in
	// flight, or an open circuit). Default 1000.
	MaxHosts int

	IdleTimeout time.Duration // forget a host idle this long; default 5m
}

var perHostFields = fieldSet[PerHostOptions]{
	"enabled": boolField(func(o *PerHostOptions) *bool { return &o.Enabled }),
	"maxHosts": intField(func(o *PerHostOptions) *int { return &o.MaxHosts },
		keepZero),
	"idleTimeout": durationField(func(o *PerHostOptions) *time.Duration { return &o.IdleTimeout },
		keepZero),
}

// resolvePerHost fills in per-host isolation's defaults and validates it.
func resolvePerHost(ph *PerHostOptions, bad badOption) error {
	switch {
	case ph.MaxHosts < 0:
		return bad("PerHost.MaxHosts", ph.MaxHosts, "must not be negative")
	case ph.IdleTimeout < 0:
		return bad("PerHost.IdleTimeout", ph.IdleTimeout, "must not be negative")
	}
	if ph.MaxHosts == 0 {
		ph.MaxHosts = defaultMaxHosts
	}
	if ph.IdleTimeout == 0 {
		ph.IdleTimeout = defaultHostIdleTimeout
	}
	return nil
}
