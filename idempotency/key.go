package idempotency

import "fmt"

// parseKey validates the key header's value: a bare token or a Structured
// Field string (RFC 8941) of printable ASCII without quotes or backslashes,
// 1 to max bytes.
func parseKey(v string, max int) (string, error) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if v == "" {
		return "", fmt.Errorf("empty key")
	}
	if len(v) > max {
		return "", fmt.Errorf("key of %d bytes, over the limit of %d", len(v), max)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return "", fmt.Errorf("byte %d of the key (0x%02x) is not printable ASCII, or is a quote or backslash", i, c)
		}
	}
	return v, nil
}
