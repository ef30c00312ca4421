// Package redact makes text from outside the resilience handler (error
// messages, status lines an upstream chose) fit to keep and to show in
// reasons, health reports and logs: the secrets of URLs redacted, control
// characters escaped, the length bounded.
package redact

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Error returns err's message with the query, fragment and userinfo
// of every *url.Error's URL in err's tree redacted, the rest of the message
// as it was. It finds the URLs by type, not by guessing at the text: each
// *url.Error's URL is replaced where it appears in the message, as url.Error
// quotes it and as it is.
func Error(err error) string {
	msg := err.Error()
	var urls []string
	Walk(err, func(e error) bool {
		if ue, ok := e.(*url.Error); ok && ue.URL != "" && URL(ue.URL) != ue.URL {
			urls = append(urls, ue.URL)
		}
		return false
	})
	if len(urls) == 0 {
		return msg
	}
	// One pass, the longest URL first where several start at one place, so
	// that redacting a URL that is a prefix of another cannot leave the
	// other's query behind.
	sort.Slice(urls, func(i, j int) bool { return len(urls[i]) > len(urls[j]) })
	pairs := make([]string, 0, 4*len(urls))
	for _, u := range urls {
		red := URL(u)
		pairs = append(pairs, strconv.Quote(u), strconv.Quote(red), u, red)
	}
	return strings.NewReplacer(pairs...).Replace(msg)
}

// Known returns s with the secrets of u, a URL the caller knows s may
// quote (the request's), redacted wherever they appear as u writes them:
// its userinfo dropped, its query and fragment replaced with "redacted", as
// URL does. It finds what Error cannot: the URL in the text of an error
// that is not a *url.Error, such as one a RoundTripper made with
// fmt.Errorf, whatever host it names (an endpoint's, for a rewritten
// request). A nil u, or one without secrets, leaves s as it is.
func Known(s string, u *url.URL) string {
	if u == nil || (u.User == nil && u.RawQuery == "" && u.Fragment == "") {
		return s
	}
	var pairs []string
	if u.User != nil {
		if ui := u.User.String(); ui != "" {
			pairs = append(pairs, ui+"@", "")
		}
		raw := u.User.Username()
		if pw, ok := u.User.Password(); ok {
			// url.URL.Redacted masks the password only: the username
			// may be the credential (a token as the userinfo).
			pairs = append(pairs, url.UserPassword(u.User.Username(), "xxxxx").String()+"@", "")
			raw += ":" + pw
		}
		if raw != "" && raw != u.User.String() {
			pairs = append(pairs, raw+"@", "")
		}
	}
	if u.RawQuery != "" {
		pairs = append(pairs, "?"+u.RawQuery, "?redacted")
	}
	if u.Fragment != "" {
		pairs = append(pairs, "#"+u.EscapedFragment(), "#redacted")
		if u.Fragment != u.EscapedFragment() {
			pairs = append(pairs, "#"+u.Fragment, "#redacted")
		}
	}
	if len(pairs) == 0 {
		return s
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// URL drops the userinfo of a URL and replaces its query and fragment
// with "redacted", keeping the scheme, host and path: enough to say which
// upstream failed, without the credentials or API keys a URL may carry.
// (url.URL.Redacted masks only the password.) It works on the text, so that
// a URL url.Parse would refuse is redacted too.
func URL(s string) string {
	var b strings.Builder
	rest := s
	if i := strings.Index(rest, "://"); i >= 0 && !strings.ContainsAny(rest[:i], "/?#") {
		b.WriteString(rest[:i+3])
		rest = rest[i+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		host := rest[:end]
		if at := strings.LastIndexByte(host, '@'); at >= 0 {
			host = host[at+1:]
		}
		b.WriteString(host)
		rest = rest[end:]
	}
	path, tail := rest, ""
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		path, tail = rest[:i], rest[i:]
	}
	b.WriteString(path)
	if strings.HasPrefix(tail, "?") {
		b.WriteString("?redacted")
	}
	if strings.Contains(tail, "#") {
		b.WriteString("#redacted")
	}
	return b.String()
}

// Text returns s with control characters escaped (a newline as \n, an
// ANSI escape as \x1b, a bidirectional override as \u202e, a line separator
// as \u2028) and invalid UTF-8 replaced, so that text an upstream chose
// cannot forge log lines or terminal output; and cut to at most limit bytes,
// as Cut does.
func Text(s string, limit int) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			clean = false
			break
		}
	}
	if !clean {
		s = escapeControls(s, limit)
	}
	return Cut(s, limit)
}

// escapeControls escapes s as Text says, stopping once the result is
// longer than limit, which Cut will cut anyway.
func escapeControls(s string, limit int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() <= limit; {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteRune(utf8.RuneError)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.In(r, unicode.Bidi_Control, unicode.Zl, unicode.Zp):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// cutMark ends a text that was cut.
const cutMark = "…"

// Cut returns s if it is at most limit bytes long, and otherwise its
// longest prefix that ends on a rune boundary and leaves room for cutMark,
// followed by cutMark: at most limit bytes in all, valid UTF-8 if s was.
func Cut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	n := limit - len(cutMark)
	if n < 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + cutMark
}

// maxErrorTree bounds how many errors of a tree Walk visits, so that
// a pathological Unwrap cannot make it loop for ever.
const maxErrorTree = 64

// Walk calls f for err and the errors it wraps, depth first, as
// errors.As would visit them, until f returns true; it reports whether f
// did.
func Walk(err error, f func(error) bool) bool {
	stack := []error{err}
	for seen := 0; len(stack) > 0 && seen < maxErrorTree; seen++ {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e == nil {
			continue
		}
		if f(e) {
			return true
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			stack = append(stack, u.Unwrap())
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			for i := len(errs) - 1; i >= 0; i-- {
				stack = append(stack, errs[i])
			}
		}
	}
	return false
}
