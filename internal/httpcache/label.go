package httpcache

import (
	"net/http"
	"strings"
)

// ReservedLabel reports whether name, in any case, is a header field the
// label must not overwrite: hop-by-hop fields (RFC 9110 section 7.6.1:
// Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding,
// Upgrade), the fields that frame or describe the body (Content-*), those
// caching and freshness depend on (RFC 9111: Age, Cache-Control, Date,
// ETag, Expires, Last-Modified, Pragma, Vary, Warning), and Set-Cookie.
func ReservedLabel(name string) bool {
	name = http.CanonicalHeaderKey(name)
	if strings.HasPrefix(name, "Proxy-") || strings.HasPrefix(name, "Content-") {
		return true
	}
	switch name {
	case "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Age", "Cache-Control", "Date", "Etag", "Expires", "Last-Modified", "Pragma", "Vary", "Warning",
		"Set-Cookie":
		return true
	}
	return false
}
