package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://host/p":                            "http://host/p",
		"http://host":                              "http://host",
		"https://user:pw@host:8443/a/b?k=SECRET":   "https://host:8443/a/b?redacted",
		"http://user@host?k=v":                     "http://host?redacted",
		"http://a@b@host/p#tok=SECRET":             "http://host/p#redacted",
		"http://host/p?k=SECRET#frag":              "http://host/p?redacted#redacted",
		"http://host/p?":                           "http://host/p?redacted",
		"http://host/p/x@y":                        "http://host/p/x@y", // an @ in the path is no userinfo
		"http://host/p?next=http://u:pw@other/":    "http://host/p?redacted",
		"/relative/path?k=SECRET":                  "/relative/path?redacted",
		"http://[::1]:80/%zz?k=SECRET":             "http://[::1]:80/%zz?redacted", // url.Parse refuses it
		"HTTP://User:Pw@Host.Example/P?K=V#F":      "HTTP://Host.Example/P?redacted#redacted",
		"http://host/p\"q?k=SECRET":                "http://host/p\"q?redacted",
		"unix:///var/run/x.sock?k=SECRET":          "unix:///var/run/x.sock?redacted",
		"http://user:pw@host:8080":                 "http://host:8080",
		"opaque:user:pw@host?k=SECRET":             "opaque:user:pw@host?redacted",
		"":                                         "",
		"http://h/?a=1&b=2#x?y":                    "http://h/?redacted#redacted",
		"http://h/#x?y":                            "http://h/#redacted",
		"http://user:p%40ss@h/":                    "http://h/",
		"http://user:pw@h/path@with?q=user:pw@h":   "http://h/path@with?redacted",
		"ftp://anonymous:guest@ftp.example/file":   "ftp://ftp.example/file",
		"http://h/p?" + strings.Repeat("x", 1<<10): "http://h/p?redacted",
	} {
		assert.Equal(t, want, URL(in), "%q", in)
	}
}

func TestRedactedErrorFindsEveryURLError(t *testing.T) {
	const secret = "http://user:pw@host/p?apiKey=SECRET"
	const redacted = "http://host/p?redacted"
	base := &url.Error{Op: "Get", URL: secret, Err: errors.New("connection refused")}
	quoting := &url.Error{Op: "Post", URL: "http://h/\"x\"?k=SECRET\n", Err: errors.New("EOF")}

	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"bare":      {base, `Get "` + redacted + `": connection refused`},
		"wrapped":   {fmt.Errorf("attempt 2: %w", base), `attempt 2: Get "` + redacted + `": connection refused`},
		"twice":     {fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", base)), `outer: inner: Get "` + redacted + `": connection refused`},
		"joined":    {errors.Join(errors.New("first"), base), "first\nGet \"" + redacted + "\": connection refused"},
		"quoted":    {quoting, `Post "http://h/\"x\"?redacted": EOF`},
		"two":       {errors.Join(base, quoting), "Get \"" + redacted + "\": connection refused\nPost \"http://h/\\\"x\\\"?redacted\": EOF"},
		"verbatim":  {fmt.Errorf("to %s: %w", secret, base), "to " + redacted + ": Get \"" + redacted + "\": connection refused"},
		"empty URL": {&url.Error{Op: "Get", URL: "", Err: errors.New("x")}, `Get "": x`},
		"no URL":    {errors.New("plain"), "plain"},
		"prefix": {errors.Join(
			&url.Error{Op: "Get", URL: "http://h/p?a=1", Err: errors.New("x")},
			&url.Error{Op: "Get", URL: "http://h/p?a=1&k=SECRET", Err: errors.New("y")},
			fmt.Errorf("raw http://h/p?a=1&k=SECRET")),
			"Get \"http://h/p?redacted\": x\nGet \"http://h/p?redacted\": y\nraw http://h/p?redacted"},
	} {
		assert.Equal(t, tc.want, Error(tc.err), name)
	}
}

// loopError unwraps to itself: walking its tree must still end.
type loopError struct{}

func (e *loopError) Error() string { return "loop" }
func (e *loopError) Unwrap() error { return e }

func TestRedactedErrorEndsOnACyclicTree(t *testing.T) {
	assert.Equal(t, "loop", Error(&loopError{}))
}

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
		assert.Equal(t, want, Text(in, 100), "%q", in)
	}
}

func TestSafeTextBoundsOnRuneBoundaries(t *testing.T) {
	s := strings.Repeat("aé€𝄞\n", 50) // runes of 1 to 4 bytes, and an escape
	escaped := strings.ReplaceAll(s, "\n", `\n`)
	for limit := 0; limit <= len(escaped)+10; limit++ {
		got := Text(s, limit)
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
	assert.Equal(t, "short", Text("short", 5))
	assert.Equal(t, "sh…", Text("shorts", 5))
}

// Known redacts a known URL's secrets in text that is no *url.Error,
// whatever host the text names.
func TestKnownURLSecrets(t *testing.T) {
	u, err := url.Parse("http://user:p%40ss@host:8080/items/7?apiKey=SECRET&x=1#tok=FRAG%20X")
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"Get " + u.String() + ": refused":                       "Get http://host:8080/items/7?redacted#redacted: refused",
		fmt.Sprintf("Get %q: refused", u.String()):              `Get "http://host:8080/items/7?redacted#redacted": refused`,
		"Get " + u.Redacted() + ": refused":                     "Get http://host:8080/items/7?redacted#redacted: refused",
		"upstream https://eu.example/items/7?apiKey=SECRET&x=1": "upstream https://eu.example/items/7?redacted",
		"as typed: http://user:p@ss@host:8080/":                 "as typed: http://host:8080/",
		"fragment as typed: #tok=FRAG X":                        "fragment as typed: #redacted",
		"no URL here":                                           "no URL here",
	} {
		assert.Equal(t, want, Known(in, u), "%q", in)
	}
	assert.Equal(t, "text ?apiKey=SECRET", Known("text ?apiKey=SECRET", nil))
	plain, _ := url.Parse("http://host/p")
	assert.Equal(t, "http://host/p?q", Known("http://host/p?q", plain), "a URL without secrets changes nothing")
}
