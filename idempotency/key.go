package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// parseKey validates the key header's value and returns the key: either a
// bare token of printable ASCII without spaces, quotes or backslashes, or a
// Structured Field string (RFC 9651 section 3.3.3): printable ASCII
// (0x20-0x7E) between double quotes, in which a quote or a backslash is
// escaped by a backslash and no other escape is allowed. The key is the
// string's unescaped value, so "abc" and abc are one key. It must be 1 to
// max bytes long.
func parseKey(v string, max int) (string, error) {
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseSFString(v); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
				return "", fmt.Errorf("byte %d of the key (0x%02x) is not allowed in a bare key (printable ASCII without spaces, quotes or backslashes; quote the key as a Structured Field string for those)", i, c)
			}
		}
	}
	if key == "" {
		return "", errors.New("empty key")
	}
	if len(key) > max {
		return "", fmt.Errorf("key of %d bytes, over the limit of %d", len(key), max)
	}
	return key, nil
}

// parseSFString parses v, which starts with a double quote, as a whole
// Structured Field string and returns its unescaped value.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) {
				return "", errors.New("the Structured Field string ends inside an escape")
			}
			if e := v[i]; e != '"' && e != '\\' {
				return "", fmt.Errorf("byte %d of the key: escape \\%c is not allowed in a Structured Field string (only \\\" and \\\\)", i, e)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("byte %d of the key: text after the closing quote of a Structured Field string", i+1)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %d of the key (0x%02x) is not printable ASCII", i, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the Structured Field string has no closing quote")
}
