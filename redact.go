package resilience

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file makes text from outside the handler (error messages, status
// lines the upstream chose) fit to keep and to show in reasons, health
// reports and logs: control characters escaped, the length bounded.

// safeText returns s with control characters escaped (a newline as \n, an
// ANSI escape as \x1b, a bidirectional override as \u202e, a line separator
// as \u2028) and invalid UTF-8 replaced, so that text an upstream chose
// cannot forge log lines or terminal output; and cut to at most limit bytes,
// as cutText does.
func safeText(s string, limit int) string {
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
	return cutText(s, limit)
}

// escapeControls escapes s as safeText says, stopping once the result is
// longer than limit, which cutText will cut anyway.
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

// cutText returns s if it is at most limit bytes long, and otherwise its
// longest prefix that ends on a rune boundary and leaves room for cutMark,
// followed by cutMark: at most limit bytes in all, valid UTF-8 if s was.
func cutText(s string, limit int) string {
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
