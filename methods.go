package resilience

import (
	"net/http"
	"strconv"
	"strings"
)

// The method rule: a request is repeated (retried, or hedged) only when its
// method is in the handler's set, GET by default, unless the request's
// context says otherwise through WithRetryable. The rule holds for every
// outcome: a POST that timed out is no more repeated than a POST that got a
// 503, since the server may have acted on it either way.

// methodSet is the set of methods a handler repeats.
type methodSet map[string]struct{}

// methodError is a method name a user got wrong.
type methodError struct {
	field, value, reason string
}

// newMethodSet returns safe, widened by include, then narrowed by exclude:
// a method in both include and exclude is excluded. That is what layered
// configuration needs, where the defaults widen the set and one upstream
// narrows it again.
func newMethodSet(safe, include, exclude []string) (methodSet, *methodError) {
	s := make(methodSet, len(safe)+len(include))
	for _, m := range safe {
		s[m] = struct{}{}
	}
	for i, m := range include {
		if err := checkMethod("Retry.Methods", i, m); err != nil {
			return nil, err
		}
		s[m] = struct{}{}
	}
	for i, m := range exclude {
		if err := checkMethod("Retry.ExcludeMethods", i, m); err != nil {
			return nil, err
		}
		delete(s, m)
	}
	return s, nil
}

func (s methodSet) allows(method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	_, ok := s[method]
	return ok
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
