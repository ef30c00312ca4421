package resilience

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestSafeTextEscapesControls(t *testing.T) {
	for in, want := range map[string]string{
		"503 Service Unavailable":    "503 Service Unavailable",
		"a\nb\r\tc":                  `a\nb\r\tc`,
		"\x1b[31mred\x1b[0m\x00\x7f": `\x1b[31mred\x1b[0m\x00\x7f`,
		"bidi \u202eexe.txt":         `bidi \u202eexe.txt`,
		"line\u2028sep\u2029para":    `line\u2028sep\u2029para`,
		"c1 \u0085 \u009b":           `c1 \u0085 \u009b`,
		"bad \xff\xfe utf-8":         "bad \uFFFD\uFFFD utf-8",
		"é€ and 日本語":                 "é€ and 日本語",
	} {
		assert.Equal(t, want, safeText(in, 100), "%q", in)
	}
}

func TestSafeTextBoundsOnRuneBoundaries(t *testing.T) {
	s := strings.Repeat("aé€𝄞\n", 50) // runes of 1 to 4 bytes, and an escape
	escaped := strings.ReplaceAll(s, "\n", `\n`)
	for limit := 0; limit <= len(escaped)+10; limit++ {
		got := safeText(s, limit)
		assert.LessOrEqual(t, len(got), limit, "limit %d", limit)
		assert.True(t, utf8.ValidString(got), "limit %d: %q", limit, got)
		assert.NotContains(t, got, "\n")
		switch {
		case limit >= len(escaped):
			assert.Equal(t, escaped, got)
		case limit >= len(cutMark):
			assert.True(t, strings.HasSuffix(got, cutMark), "limit %d: %q", limit, got)
			kept := strings.TrimSuffix(got, cutMark)
			assert.True(t, strings.HasPrefix(escaped, kept), "limit %d", limit)
			assert.Greater(t, len(kept), limit-len(cutMark)-utf8.UTFMax, "limit %d: cut no more than a rune", limit)
		}
	}
	assert.Equal(t, "short", safeText("short", 5))
	assert.Equal(t, "sh…", safeText("shorts", 5))
}
