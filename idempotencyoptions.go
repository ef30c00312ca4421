package resilience

import (
	"net/http"

	"github.com/resilienthttp/resilience/internal/headers"
)

// defaultIdempotencyHeader is the request header that carries the key.
const defaultIdempotencyHeader = "Idempotency-Key"

// IdempotencyOptions declares that the upstream keeps the idempotency-key
// protocol, storing each key's outcome durably, as the idempotency package
// does. A request whose method is not safe then gets a key, unless it has
// one, and is retried like a GET. A 409 saying its first request still runs
// is retried after its Retry-After; other 409s (unless Retry.ShouldRetry
// says) and 422s reach the caller. See docs/idempotency.md.
type IdempotencyOptions struct {
	Enabled bool   // the upstream keeps the protocol; default false
	Header  string // the key's request header; default "Idempotency-Key"
	Hedge   bool   // let Hedging hedge keyed writes; default false: sent once
}

// resolveIdempotency fills in the protocol's defaults and validates them.
func resolveIdempotency(o *IdempotencyOptions, bad badOption) error {
	if o.Header != "" && !headers.ValidName(o.Header) {
		return bad("Idempotency.Header", o.Header, "must be a valid header field name")
	}
	if o.Header == "" {
		o.Header = defaultIdempotencyHeader
	}
	o.Header = http.CanonicalHeaderKey(o.Header)
	return nil
}

var idempotencyFields = fieldSet[IdempotencyOptions]{
	"enabled": boolField(func(o *IdempotencyOptions) *bool { return &o.Enabled }),
	"header":  stringField(func(o *IdempotencyOptions) *string { return &o.Header }),
	"hedge":   boolField(func(o *IdempotencyOptions) *bool { return &o.Hedge }),
}
