package httpcache

import (
	"net/http"
	"strings"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
)

// Directive reports whether a Cache-Control field of h holds the
// directive name, and the argument of its first occurrence (RFC 9111
// section 4.2.1), unquoted. The fields are parsed as section 5.2 writes
// them: a list of directives, each a token, optionally "=" and a token or
// a quoted-string, which may hold commas and quoted-pairs; names compare
// case-insensitively; white space around "=" is tolerated; what does not
// parse is skipped up to the next comma outside quotes. A qualified
// no-cache or private (with a list of field names) is found like the
// unqualified form, which the fallback layer treats it as.
func Directive(h http.Header, name string) (string, bool) {
	for _, line := range headers.Values(h, "Cache-Control") {
		for line != "" {
			var k, v string
			k, v, line = nextDirective(line)
			if k != "" && strings.EqualFold(k, name) {
				return v, true
			}
		}
	}
	return "", false
}

// nextDirective parses the first directive of the Cache-Control list s,
// and returns its name, its argument and the rest of the list.
func nextDirective(s string) (name, arg, rest string) {
	s = strings.TrimLeft(s, " \t,")
	i := 0
	for i < len(s) && tokenChar(s[i]) {
		i++
	}
	name, s = s[:i], strings.TrimLeft(s[i:], " \t")
	if strings.HasPrefix(s, "=") {
		s = strings.TrimLeft(s[1:], " \t")
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			j, closed := 1, false
			for ; j < len(s); j++ {
				if c := s[j]; c == '"' {
					closed = true
					j++
					break
				} else if c == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if !closed {
				return "", "", "" // the rest of the field is inside the quotes
			}
			arg, s = b.String(), s[j:]
		} else {
			j := 0
			for j < len(s) && tokenChar(s[j]) {
				j++
			}
			arg, s = s[:j], s[j:]
		}
	}
	// Up to the next comma outside quotes: junk, if the directive did not
	// end there, makes the whole element invalid.
	if s = strings.TrimLeft(s, " \t"); s != "" && s[0] != ',' {
		name, arg = "", ""
		for quoted, j := false, 0; j < len(s); j++ {
			switch c := s[j]; {
			case c == '\\' && quoted:
				j++
			case c == '"':
				quoted = !quoted
			case c == ',' && !quoted:
				return "", "", s[j:]
			}
		}
		return "", "", ""
	}
	return name, arg, s
}

// tokenChar reports whether c may appear in an RFC 9110 token.
func tokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// MaxDeltaSeconds is what a delta-seconds too large for us reads as: RFC
// 9111 section 1.2.2 asks for 2^31 or the greatest integer one can
// represent, and never to send an Age greater than 2^31 (section 5.1).
const MaxDeltaSeconds = 1 << 31

// DeltaSeconds parses s as RFC 9111's delta-seconds (1*DIGIT, no sign, no
// white space), a value greater than 2^31 as 2^31.
func DeltaSeconds(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < MaxDeltaSeconds { // past it, the digits only need checking
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, MaxDeltaSeconds), true
}

// ReceivedAge returns the Age h came with, as RFC 9111 section 5.1 reads
// it: the first member of the field's list, ignored (0) when it is not a
// delta-seconds.
func ReceivedAge(h http.Header) time.Duration {
	v, _, _ := strings.Cut(headers.First(h, "Age"), ",")
	s, ok := DeltaSeconds(strings.Trim(v, " \t"))
	if !ok {
		return 0
	}
	return time.Duration(s) * time.Second
}
