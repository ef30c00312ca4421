package resilience

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// The method rule: a request is repeated (retried, or hedged) only when its
// method is in the handler's set, GET by default, unless the request's
// context says otherwise through WithRetryable. The rule holds for every
// outcome: a POST that timed out is no more repeated than a POST that got a
// 503, since the server may have acted on it either way.

// methodSet is the set of methods a handler repeats: the standard methods
// as bits, any other in a map. It is read on every call, and a map lookup
// there cost about 110 instructions of the handler's 5,000 on the success
// path (bench/instructions.sh); a switch on the method costs a few.
type methodSet struct {
	std   uint16              // bit i: standardMethods[i]
	other map[string]struct{} // the methods outside standardMethods, if any
}

// methodError is a method name a user got wrong.
type methodError struct {
	field, value, reason string
}

// newMethodSet returns safe, widened by include, then narrowed by exclude:
// a method in both include and exclude is excluded. That is what layered
// configuration needs, where the defaults widen the set and one upstream
// narrows it again.
func newMethodSet(safe, include, exclude []string) (methodSet, *methodError) {
	var s methodSet
	for _, m := range safe {
		s.set(m, true)
	}
	for i, m := range include {
		if err := checkMethod("Retry.Methods", i, m); err != nil {
			return methodSet{}, err
		}
		s.set(m, true)
	}
	for i, m := range exclude {
		if err := checkMethod("Retry.ExcludeMethods", i, m); err != nil {
			return methodSet{}, err
		}
		s.set(m, false)
	}
	return s, nil
}

// set puts method in s, or takes it out.
func (s *methodSet) set(method string, in bool) {
	if b := methodBit(method); b != 0 {
		if in {
			s.std |= b
		} else {
			s.std &^= b
		}
		return
	}
	if !in {
		delete(s.other, method)
		return
	}
	if s.other == nil {
		s.other = make(map[string]struct{})
	}
	s.other[method] = struct{}{}
}

func (s methodSet) allows(method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	if b := methodBit(method); b != 0 {
		return s.std&b != 0
	}
	_, ok := s.other[method]
	return ok
}

// methodBit returns the bit of a standard method in methodSet.std, or 0.
func methodBit(method string) uint16 {
	switch method {
	case http.MethodGet:
		return 1 << 0
	case http.MethodHead:
		return 1 << 1
	case http.MethodPost:
		return 1 << 2
	case http.MethodPut:
		return 1 << 3
	case http.MethodPatch:
		return 1 << 4
	case http.MethodDelete:
		return 1 << 5
	case http.MethodConnect:
		return 1 << 6
	case http.MethodOptions:
		return 1 << 7
	case http.MethodTrace:
		return 1 << 8
	}
	return 0
}

var standardMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// checkMethod reports a method name that is not an HTTP token (RFC 9110
// section 9.1), or a lower-case spelling of a standard method: methods are
// case-sensitive, so "post" would never match a POST request.
func checkMethod(field string, i int, m string) *methodError {
	f := field + "[" + strconv.Itoa(i) + "]"
	if m == "" {
		return &methodError{field: f, value: m, reason: "is empty"}
	}
	for j := 0; j < len(m); j++ {
		if !isTokenChar(m[j]) {
			return &methodError{field: f, value: m, reason: "is not a valid HTTP method token"}
		}
	}
	for _, std := range standardMethods {
		if m != std && strings.EqualFold(m, std) {
			return &methodError{field: f, value: m, reason: "methods are case-sensitive; did you mean " + std + "?"}
		}
	}
	return nil
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// repeatable reports whether req may be sent more than once under the
// method rule and its context's override.
func (s methodSet) repeatable(req *http.Request, o *overrides) bool {
	if o != nil && o.retryable != 0 {
		return o.retryable > 0
	}
	return s.allows(req.Method)
}

// The client half of the idempotency-key protocol (IETF httpapi draft
// "The Idempotency-Key HTTP Header Field"): an upstream that keeps it
// stores the outcome of each keyed request, so a write sent twice with one
// key takes effect once. For such an upstream a write that carries a key
// is as safe to retry as a GET; without one, the method rule of methods.go
// stands. The idempotency subpackage is the server half.

// isSafeMethod reports whether method is safe (RFC 9110 section 9.2.1):
// sending it has no effect a key would need to guard.
func isSafeMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// keyRequest makes c a keyed call when its handler's upstream keeps the
// protocol and its request is a write the caller did not mark as not
// retryable: the request gets a fresh random key unless it has one. The
// caller's request is never changed; a keyed copy is sent instead.
func (c *call) keyRequest() {
	o := c.cfg.Idempotency
	if !o.Enabled || isSafeMethod(c.req.Method) || (c.over != nil && c.over.retryable < 0) {
		return
	}
	c.keyed = true
	if idempotencyKey(c.req.Header, o.Header) != "" {
		return
	}
	key := newIdempotencyKey()
	r := new(http.Request)
	*r = *c.req
	r.Header = c.req.Header.Clone()
	if r.Header == nil {
		r.Header = make(http.Header, 1)
	}
	for k := range r.Header {
		if strings.EqualFold(k, o.Header) {
			delete(r.Header, k) // an empty key under any spelling: one field goes, the made one
		}
	}
	r.Header[o.Header] = []string{key}
	c.req = r
}

// idempotencyKey returns the key h carries in the field name, under any
// spelling of the name: field names are case-insensitive, and a caller or
// a proxy may set a map key that is not canonical ("idempotency-key").
func idempotencyKey(h http.Header, name string) string {
	if vs := headers.Values(h, name); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// newIdempotencyKey returns a random version 4 UUID, the form the IETF
// draft's examples use and servers commonly validate. crypto/rand.Read
// never fails (it crashes the program instead, since Go 1.24).
func newIdempotencyKey() string {
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// keyedVerdict adjusts, for a keyed call, whether the attempt that ended
// with resp is retried. A 409 that says the key's first request is still
// running (keyInProgress) is retried, unless the caller's ShouldRetry (set
// when custom) says otherwise: it has the last word. Any other 409 (the
// application's own, or a replayed one) is a final answer unless
// ShouldRetry says otherwise. A 422 says the key was used for another
// request, which no retry can mend, whatever ShouldRetry says.
func keyedVerdict(resp *http.Response, retryable, custom bool) bool {
	if resp == nil {
		return retryable
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		if keyInProgress(resp) && !custom {
			return true
		}
	case http.StatusUnprocessableEntity:
		return false
	}
	return retryable
}

// replayedHeader marks a response an upstream replayed from its store of
// keys (the idempotency package's ReplayedHeader).
const replayedHeader = "Idempotent-Replayed"

// keyInProgress reports whether resp is the protocol's answer for a key
// whose first request is still running: a 409 with a Retry-After (when to
// ask again) that is not a replay. The application's own 409 carries no
// Retry-After, and a 409 it recorded comes back marked as replayed.
func keyInProgress(resp *http.Response) bool {
	return resp.StatusCode == http.StatusConflict &&
		resp.Header.Get("Retry-After") != "" &&
		!strings.EqualFold(resp.Header.Get(replayedHeader), "true")
}

// conflictRetryAfter returns the wait a keyed call's 409 asks for, if it
// asks.
func conflictRetryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || resp.StatusCode != http.StatusConflict {
		return 0, false
	}
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	return ParseRetryAfter(v, now)
}
