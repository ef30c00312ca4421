package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// Options configure a Middleware. Every zero field means its default, except
// Principal, which is required.
type Options struct {
	// Principal says who the request is from: the tenant or authenticated
	// principal that scopes its keys. It runs before the store is touched.
	// An error refuses the request: 403 Forbidden if it wraps ErrForbidden,
	// 401 Unauthorized otherwise. Required: for a single-tenant service,
	// return a constant.
	Principal func(*http.Request) (string, error)

	// Route names the operation's route, which with the method scopes the
	// key ("POST /orders"). Default: r.URL.Path.
	Route func(*http.Request) string

	// Header is the request header that carries the key. Default
	// "Idempotency-Key" (IETF httpapi draft). Its value is a Structured
	// Field string (RFC 9651: "\"a b\"", printable ASCII in quotes, with \"
	// and \\ the only escapes), whose unescaped value is the key, or a bare
	// key of printable ASCII without spaces, quotes or backslashes (abc,
	// the same key as "\"abc\""). Anything else is refused with 400.
	Header string

	// RequireKey answers 400 to a request with an unsafe method and no key.
	// Default: such a request goes to the handler unprotected.
	RequireKey bool

	// MaxKeyLength bounds the key, in bytes. Default 255.
	MaxKeyLength int

	// DigestHeaders names request headers that are part of the request's
	// identity and so of its digest (say, "Content-Type").
	DigestHeaders []string

	// MaxBodyBytes bounds the request body, which is read in full to digest
	// it; a larger body gets 413. Default 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body recorded for replay. A
	// handler that writes more has its transaction rolled back and the key
	// released, and the caller gets 500. Default 1 MiB.
	MaxResponseBytes int64

	// ReplayHeaders, when set, is the allow-list of response headers kept
	// for replay. Default: every header but the hop-by-hop ones,
	// Set-Cookie, Date and Content-Length.
	ReplayHeaders []string

	// Lease is how long a claim stays in progress before the key may be
	// taken over by a retry if its owner died (a crash, a dropped database
	// connection): the retry gets 409 until then. An owner still running
	// past its lease keeps the key, as its store transaction is still
	// open: a retry gets 409 (PostgreSQL) or waits for it (SQLite), and
	// the owner's commit lands (see Store). An owner that is alive but
	// could not commit (its database went down) releases its claim as soon
	// as the database answers again, without waiting for its lease. It
	// bounds the Retry-After of the 409s. Default 10 seconds: the client's
	// default attempt timeout, and shorter than its default total timeout
	// (30 s), so a default client retrying a dead owner's key gets it
	// within its call. A longer lease costs nothing to live owners, which
	// keep their keys anyway; it only delays retries after a crash.
	Lease time.Duration

	// RetryAfter caps the Retry-After of a 409 for a key in progress (the
	// rest of the lease, rounded up to whole seconds, at least 1s).
	// Default 1s.
	RetryAfter time.Duration

	// TTL is how long a key is kept: longer than the longest retry horizon
	// of any client. A key reused after its TTL runs again. Default 24h.
	TTL time.Duration

	// SweepInterval is how often expired keys are deleted: the first write
	// a middleware completes sweeps, and so does the first after each
	// interval, once its response is written (no goroutine of its own). A
	// sweep deletes batches of keys until a batch comes back short (every
	// expired key is gone) or it has run for 250 ms; then the next write
	// sweeps again at once. Batches start at SweepBatch and double while
	// they come back full, up to 16 × SweepBatch. So the store keeps about
	// (TTL + SweepInterval) × keyed writes per second keys, at any rate.
	// Negative: never (call Sweep yourself). Default 1 minute.
	SweepInterval time.Duration

	// SweepBatch is how many keys the first statement of a sweep deletes
	// (later ones, up to 16 times as many, while there are). Default 1000.
	SweepBatch int

	// OnSweep, when set, receives the report of each sweep: the keys it
	// deleted, its lag, and the keys kept. It runs on the goroutine of the
	// request that swept (or of the Sweep call), after its response.
	OnSweep func(SweepReport)

	// Logger receives store errors, and each sweep: at Debug level, or at
	// Warn when it stopped with expired keys left. Default: discarded.
	Logger *slog.Logger
}

// ErrForbidden, wrapped in the error of Options.Principal, answers 403.
var ErrForbidden = errors.New("idempotency: forbidden")

const (
	defaultHeader           = "Idempotency-Key"
	defaultMaxKeyLength     = 255
	defaultMaxBodyBytes     = 1 << 20
	defaultMaxResponseBytes = 1 << 20
	defaultLease            = 10 * time.Second
	defaultRetryAfter       = time.Second
	defaultTTL              = 24 * time.Hour
	defaultSweepInterval    = time.Minute
	defaultSweepBatch       = 1000
)

// withDefaults validates o and fills in its defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Principal == nil {
		return o, errors.New("idempotency: Options.Principal is nil; it is required (return a constant for a single tenant)")
	}
	if o.Header == "" {
		o.Header = defaultHeader
	}
	o.Header = http.CanonicalHeaderKey(o.Header)
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"MaxKeyLength", int64(o.MaxKeyLength)},
		{"MaxBodyBytes", o.MaxBodyBytes},
		{"MaxResponseBytes", o.MaxResponseBytes},
		{"Lease", int64(o.Lease)},
		{"RetryAfter", int64(o.RetryAfter)},
		{"TTL", int64(o.TTL)},
		{"SweepBatch", int64(o.SweepBatch)},
	} {
		if c.v < 0 {
			return o, fmt.Errorf("idempotency: invalid option %s (%d): want zero (the default) or more", c.name, c.v)
		}
	}
	if o.MaxKeyLength == 0 {
		o.MaxKeyLength = defaultMaxKeyLength
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = defaultMaxBodyBytes
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = defaultMaxResponseBytes
	}
	if o.Lease == 0 {
		o.Lease = defaultLease
	}
	if o.RetryAfter == 0 {
		o.RetryAfter = defaultRetryAfter
	}
	if o.TTL == 0 {
		o.TTL = defaultTTL
	}
	if o.TTL < o.Lease {
		return o, fmt.Errorf("idempotency: invalid option TTL (%v): shorter than Lease (%v)", o.TTL, o.Lease)
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = defaultSweepInterval
	}
	if o.SweepBatch == 0 {
		o.SweepBatch = defaultSweepBatch
	}
	for i, h := range o.DigestHeaders {
		if h == "" {
			return o, fmt.Errorf("idempotency: invalid option DigestHeaders[%d]: empty header name", i)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}
