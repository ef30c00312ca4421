package httpcache

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Cache-Control is parsed as RFC 9111 section 5.2 writes it: directive
// names in any case, arguments as tokens or quoted strings (commas inside
// quotes are no separators), the first occurrence of a directive counts
// (section 4.2.1), delta-seconds too large for us read as 2^31.
func TestCacheDirective(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		name  string
		arg   string
		found bool
	}{
		{[]string{`no-cache="a, b"`}, "no-cache", "a, b", true},
		{[]string{`no-cache="a, b"`}, "b", "", false},
		{[]string{`max-age=60, ext="x, private"`}, "private", "", false},
		{[]string{`ext="a\", private", max-age=1`}, "private", "", false},
		{[]string{`ext="a\", private", max-age=1`}, "max-age", "1", true},
		{[]string{`ext="a\\", private`}, "private", "", true},
		{[]string{`ext="x, stale-if-error=5"`}, "stale-if-error", "", false},
		{[]string{`ext="unterminated, no-store`}, "no-store", "", false},
		{[]string{`stale-if-error="5"`}, "stale-if-error", "5", true},
		{[]string{`STALE-IF-ERROR=5`}, "stale-if-error", "5", true},
		{[]string{`stale-if-error=5, stale-if-error=100`}, "stale-if-error", "5", true},
		{[]string{`max-age=1`, `stale-if-error=7`}, "stale-if-error", "7", true},
		{[]string{`,, no-store ,`}, "no-store", "", true},
		{[]string{`no-storex, xno-store`}, "no-store", "", false},
		{[]string{`private="Set-Cookie"`}, "private", "Set-Cookie", true},
		{[]string{`max-age = 5`}, "max-age", "5", true},
		{[]string{`a=b c, no-store`}, "no-store", "", true},
		{nil, "no-store", "", false},
	} {
		arg, found := Directive(http.Header{"Cache-Control": tc.lines}, tc.name)
		assert.Equal(t, tc.found, found, "%q %s", tc.lines, tc.name)
		assert.Equal(t, tc.arg, arg, "%q %s", tc.lines, tc.name)
	}
	for s, want := range map[string]int64{
		"0": 0, "5": 5, "2147483647": 2147483647, "2147483648": 1 << 31, "2147483649": 1 << 31,
		"9223372036854775808": 1 << 31, "99999999999999999999": 1 << 31, "007": 7,
	} {
		got, ok := DeltaSeconds(s)
		assert.True(t, ok, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "-1", "+1", " 1", "1 ", "1.0", "0x1", "1e3", "abc"} {
		_, ok := DeltaSeconds(s)
		assert.False(t, ok, "%q", s)
	}
}

// The fallback reads Cache-Control and Age from upstream bytes: whatever
// they hold, the parse ends, every step moves on, a directive's name is a
// token, and an Age is between 0 and 2^31 seconds.
func FuzzCacheDirective(f *testing.F) {
	for _, s := range []string{
		"max-age=60", `no-cache="a, b", stale-if-error=5`, `ext="x, stale-if-error=5"`, `private="\"", max-age=1`,
		"=,=", `"`, `a="\`, ",,, ,", "stale-if-error = 5", "100, 5", "99999999999999999999", "+5",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		for s, steps := v, 0; s != ""; steps++ {
			name, _, rest := nextDirective(s)
			if len(rest) >= len(s) {
				t.Fatalf("nextDirective(%q) made no progress: rest %q", s, rest)
			}
			for i := 0; i < len(name); i++ {
				if !tokenChar(name[i]) {
					t.Fatalf("nextDirective(%q) = name %q, not a token", s, name)
				}
			}
			s = rest
		}
		h := http.Header{"Cache-Control": {v}, "Age": {v}}
		Directive(h, "stale-if-error")
		if age := ReceivedAge(h); age < 0 || age > MaxDeltaSeconds*time.Second {
			t.Fatalf("ReceivedAge(%q) = %v, outside [0, 2^31 s]", v, age)
		}
	})
}
