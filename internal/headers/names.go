// Package headers reads the HTTP header fields the resilience handler
// acts on. It looks fields up by name case-insensitively, as RFC 9110
// section 5.1 compares them, where http.Header's methods look up only the
// canonical form (names.go); it reads the quota a server announces in its
// RateLimit and X-RateLimit fields (quota.go, with the RFC 9651 parser in
// sfv.go) and the wait a Retry-After field asks for (retryafter.go). Every
// value read is an upstream's bytes and is bounded where it is read.
package headers

import (
	"net/http"
	"slices"
	"strings"
)

// A caller that writes req.Header["authorization"] sends the field, and
// Header.Get("Authorization") does not see it. Every decision of the
// resilience handler that depends on a header, a request's or an
// upstream's, looks it up here instead.

// Values returns the values of every field of h named name, compared
// case-insensitively: those of the canonical key first, then those of the
// other spellings, in the order of their keys. It allocates only when more
// than one spelling is present. The result must not be modified.
func Values(h http.Header, name string) []string {
	vs := h[name]
	var others []string // the other spellings present, if any
	for k := range h {
		if len(k) == len(name) && k != name && strings.EqualFold(k, name) {
			others = append(others, k)
		}
	}
	if others == nil {
		return vs
	}
	slices.Sort(others)
	out := slices.Clip(vs)
	for _, k := range others {
		out = append(out, h[k]...)
	}
	return out
}

// Has reports whether h has a field named name, compared
// case-insensitively, with at least one value.
func Has(h http.Header, name string) bool {
	if len(h[name]) > 0 {
		return true
	}
	for k, vs := range h {
		if len(vs) > 0 && len(k) == len(name) && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// CanonicalClone returns a copy of h with every name in canonical form, the
// values of the spellings of one name together, so that Set replaces them
// all. A header from a store or a RoundTripper other than net/http's may
// hold names in any case.
func CanonicalClone(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k := range h {
		ck := http.CanonicalHeaderKey(k)
		if _, done := out[ck]; !done {
			out[ck] = slices.Clone(Values(h, ck))
		}
	}
	return out
}

// First returns the first value of the fields of h named name, compared
// case-insensitively, or "".
func First(h http.Header, name string) string {
	if vs := Values(h, name); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// ValidName reports whether s is an RFC 9110 token, as a field name must
// be.
func ValidName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
