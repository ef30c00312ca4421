package httpcache

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The parts of the target that are the same target written differently
// give one key; every other part gives another.
func TestKeyTarget(t *testing.T) {
	key := func(raw, host string) string {
		req, err := http.NewRequest(http.MethodGet, raw, nil)
		require.NoError(t, err)
		req.Host = host
		return Key(req, false)
	}
	base := key("http://api.example/p?q=1", "")
	for _, same := range [][2]string{
		{"http://api.example/p?q=1#frag", ""},
		{"HTTP://API.Example/p?q=1", ""},
		{"http://api.example:80/p?q=1", ""},
		{"http://api.example/p?q=1", "api.example"},
		{"http://api.example/p?q=1", "API.EXAMPLE:80"},
	} {
		assert.Equal(t, base, key(same[0], same[1]), "%v", same)
	}
	for _, other := range [][2]string{
		{"https://api.example/p?q=1", ""},
		{"http://api.example:8080/p?q=1", ""},
		{"http://other.example/p?q=1", ""},
		{"http://api.example/p?q=1", "other.example"},
		{"http://api.example/p?q=1", "api.example:8080"},
		{"http://api.example/P?q=1", ""},
		{"http://api.example/p?q=2", ""},
		{"http://api.example/p", ""},
		{"http://api.example/p?", ""},
	} {
		assert.NotEqual(t, base, key(other[0], other[1]), "%v", other)
	}
	assert.Equal(t, key("https://api.example/p", ""), key("https://api.example:443/p", ""))

	// An opaque URL's authority is sent as it is, but its userinfo never
	// enters the key.
	req := &http.Request{Method: http.MethodGet, Header: http.Header{},
		URL: &url.URL{Scheme: "http", Host: "api.example", Opaque: "//erin:s3cr3t@api.example/p", RawQuery: "q=1"}}
	k := Key(req, true)
	assert.NotContains(t, k, "s3cr3t")
	assert.Contains(t, k, "api.example/p?q=1")
	assert.Contains(t, k, "\x00cred=", "its userinfo is a credential")
	assert.Empty(t, Key(req, false), "not kept without ShareCredentialed")
}
