package idempotency

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The key header's value is a bare token or a Structured Field string
// (RFC 9651 section 3.3.3), whose unescaped value is the key.
func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in, key, err string
	}{
		{in: `abc`, key: `abc`},
		{in: `"abc"`, key: `abc`},
		{in: `"a b"`, key: `a b`},
		{in: `" "`, key: ` `},
		{in: `"a\"b"`, key: `a"b`},
		{in: `"a\\b"`, key: `a\b`},
		{in: `"\\\""`, key: `\"`},
		{in: `"12345678"`, key: `12345678`},
		{in: `"1234567\\"`, key: `1234567\`}, // 8 bytes unescaped: within the limit

		{in: ``, err: "empty key"},
		{in: `""`, err: "empty key"},
		{in: `a b`, err: "bare key"},
		{in: `a"b`, err: "bare key"},
		{in: `a\b`, err: "bare key"},
		{in: "a\x01b", err: "bare key"},
		{in: `123456789`, err: "over the limit of 8"},
		{in: `"123456789"`, err: "over the limit of 8"},
		{in: `"`, err: "no closing quote"},
		{in: `"abc`, err: "no closing quote"},
		{in: `"abc\"`, err: "no closing quote"},
		{in: `"abc\`, err: "inside an escape"},
		{in: `"a\nb"`, err: `escape \n is not allowed`},
		{in: `"a\'b"`, err: `escape \' is not allowed`},
		{in: `"a"b"`, err: "after the closing quote"},
		{in: `"ab" `, err: "after the closing quote"},
		{in: `"ab";x`, err: "after the closing quote"},
		{in: "\"a\tb\"", err: "not printable ASCII"},
		{in: "\"a\x7fb\"", err: "not printable ASCII"},
		{in: "\"caf\xc3\xa9\"", err: "not printable ASCII"},
	} {
		key, err := parseKey(c.in, 8)
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, "%s", c.in)
			assert.Empty(t, key, "%s", c.in)
			continue
		}
		if assert.NoError(t, err, "%s", c.in) {
			assert.Equal(t, c.key, key, "%s", c.in)
		}
	}
	punct := ` !#$%&'()*+,-./:;<=>?@[]^_{|}~`
	key, err := parseKey(`"`+punct+`"`, 64)
	assert.NoError(t, err)
	assert.Equal(t, punct, key, "every printable byte but the two escaped ones stands for itself")
}
