package resilience

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/internal/httpcache"
)

// Defaults of the fallback layer.
const (
	defaultFallbackMaxStale      = 10 * time.Minute
	defaultFallbackMaxEntryBytes = 1 << 20
	defaultFallbackMaxBytes      = 64 << 20
	defaultFallbackHeader        = "X-Resilience-Fallback"
)

// FallbackOptions configures the fallback layer: a GET or HEAD that fails
// on an open circuit (or, with OnTransient, a transient failure) gets the
// last good response kept for it, labelled, or an error that wraps
// [ErrFallbackRefused]. A response's stale-if-error=N replaces MaxStale.
// See docs/fallback.md.
type FallbackOptions struct {
	Enabled  bool          // turns the fallback layer on; default false
	MaxStale time.Duration // oldest served, its Age included; default 10m

	MaxEntryBytes int64 // largest body kept, at most MaxBytes; default 1 MiB, or MaxBytes if less
	MaxBytes      int64 // the built-in store's bound; default 64 MiB, or MaxEntryBytes if more

	// Header labels a served fallback "stale". Default "X-Resilience-Fallback";
	// a field the label would overwrite, such as Age or Vary, is an error.
	Header string

	// OnTransient also serves a fallback when retries ran out on a transient
	// error or a 500, 502, 503 or 504, or on the total timeout. Default false.
	OnTransient bool

	// ShareCredentialed keeps responses to requests with credentials, for
	// the same credentials only. Default false: they are never kept.
	ShareCredentialed bool

	Store FallbackStore // default nil: the built-in store; not in files
}

// resolveFallback fills in the fallback layer's defaults and validates it.
func resolveFallback(f *FallbackOptions, bad badOption) error {
	switch {
	case f.MaxStale < 0:
		return bad("Fallback.MaxStale", f.MaxStale, "must not be negative")
	case f.MaxEntryBytes < 0:
		return bad("Fallback.MaxEntryBytes", f.MaxEntryBytes, "must not be negative")
	case f.MaxBytes < 0:
		return bad("Fallback.MaxBytes", f.MaxBytes, "must not be negative")
	case f.Header != "" && !headers.ValidName(f.Header):
		return bad("Fallback.Header", f.Header, "must be a valid header field name")
	case f.Header != "" && httpcache.ReservedLabel(f.Header):
		return bad("Fallback.Header", f.Header,
			"must not name a hop-by-hop, framing or caching header field, which the label would overwrite")
	}
	if f.MaxStale == 0 {
		f.MaxStale = defaultFallbackMaxStale
	}
	// Each default bound yields to the other, explicit: an entry bound
	// fits an explicit MaxBytes, and the store holds an explicit
	// MaxEntryBytes.
	switch {
	case f.MaxEntryBytes == 0 && f.MaxBytes == 0:
		f.MaxEntryBytes, f.MaxBytes = defaultFallbackMaxEntryBytes, defaultFallbackMaxBytes
	case f.MaxEntryBytes == 0:
		f.MaxEntryBytes = min(defaultFallbackMaxEntryBytes, f.MaxBytes)
	case f.MaxBytes == 0:
		f.MaxBytes = max(defaultFallbackMaxBytes, f.MaxEntryBytes)
	}
	if f.MaxEntryBytes > f.MaxBytes { // both explicit
		return bad("Fallback.MaxEntryBytes", f.MaxEntryBytes, "must not exceed Fallback.MaxBytes ("+strconv.FormatInt(f.MaxBytes, 10)+")")
	}
	if f.Header == "" {
		f.Header = defaultFallbackHeader
	}
	f.Header = http.CanonicalHeaderKey(f.Header)
	return nil
}

// stringField decodes a JSON string.
func stringField[T any](field func(*T) *string) func(*T, json.RawMessage, string) error {
	return func(v *T, raw json.RawMessage, path string) error {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return configErr(path, "want a string, got %s", brief(raw))
		}
		*field(v) = s
		return nil
	}
}

var fallbackFields = fieldSet[FallbackOptions]{
	"enabled": boolField(func(o *FallbackOptions) *bool { return &o.Enabled }),
	"maxStale": durationField(func(o *FallbackOptions) *time.Duration { return &o.MaxStale },
		keepZero),
	"maxEntryBytes": intField(func(o *FallbackOptions) *int64 { return &o.MaxEntryBytes },
		keepZero),
	"maxBytes": intField(func(o *FallbackOptions) *int64 { return &o.MaxBytes },
		keepZero),
	"header":            stringField(func(o *FallbackOptions) *string { return &o.Header }),
	"onTransient":       boolField(func(o *FallbackOptions) *bool { return &o.OnTransient }),
	"shareCredentialed": boolField(func(o *FallbackOptions) *bool { return &o.ShareCredentialed }),
}
