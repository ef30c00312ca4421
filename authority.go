package resilience

import (
	"net/url"
	"strings"
)

// A hostKey is an authority: scheme and host[:port], in lower case, without
// the scheme's default port. A struct of the URL's own strings, it costs no
// allocation for a URL already in that form.
type hostKey struct{ scheme, host string }

func keyOf(u *url.URL) hostKey {
	scheme, host := u.Scheme, u.Host
	switch {
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = host[:len(host)-3]
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = host[:len(host)-4]
	}
	if hasUpper(scheme) {
		scheme = strings.ToLower(scheme)
	}
	if hasUpper(host) {
		host = strings.ToLower(host)
	}
	return hostKey{scheme, host}
}

func (k hostKey) String() string { return k.scheme + "://" + k.host }

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}
