// Package httpcache holds the HTTP caching rules (RFC 9111) the stale
// fallback keeps and serves responses by: the key a request's response is
// kept under (Key, VariantKey, VaryNames), the Cache-Control directives and
// Age it reads (Directive, DeltaSeconds, ReceivedAge), and the fields its
// label may not overwrite (ReservedLabel). Every value read is an
// upstream's or a caller's bytes, bounded where it is read.
package httpcache

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/resilienthttp/resilience/internal/headers"
)

// Key is the key of req's kept response, without its Vary part, or ""
// when req may not be answered from, or kept in, a store: not a GET or
// HEAD, Cache-Control: no-store, or credentialed without
// shareCredentialed. The key is
// the target the request is sent to (target), never its userinfo;
// a credentialed request's key ends with a hash of its credentials.
func Key(req *http.Request, shareCredentialed bool) string {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return ""
	}
	if _, ok := Directive(req.Header, "no-store"); ok {
		return ""
	}
	key := "GET " + target(req)
	if credentialed(req) {
		if !shareCredentialed {
			return ""
		}
		sum := sha256.New()
		if u := req.URL.User; u != nil {
			sum.Write([]byte("userinfo:" + u.String() + "\n"))
		}
		if ui := opaqueUserinfo(req.URL); ui != "" {
			sum.Write([]byte("userinfo:" + ui + "\n"))
		}
		for _, name := range []string{"Authorization", "Cookie"} {
			for _, v := range headers.Values(req.Header, name) {
				sum.Write([]byte(name + ":" + v + "\n"))
			}
		}
		key += "\x00cred=" + hex.EncodeToString(sum.Sum(nil))
	}
	return key
}

// target returns the target req is sent to, as its key names it:
// scheme://host[:port] and the request-target of the request line (path
// and query, no fragment, no userinfo), the scheme and host in lower case
// and a default port left out; then, when req.Host names another host
// than the URL (the Host header the server reads, for a virtual host),
// "\x00host=" and that host.
func target(req *http.Request) string {
	u := req.URL
	scheme := strings.ToLower(u.Scheme)
	host := keyHost(scheme, u.Host)
	target := u.RequestURI()
	if strings.HasPrefix(u.Opaque, "//") { // scheme://authority/path, sent as it is: without its userinfo
		rest := strings.TrimPrefix(target, u.Scheme+"://")
		auth, path := rest, ""
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			auth, path = rest[:i], rest[i:]
		}
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			auth = auth[at+1:]
		}
		target = "\x00opaque=" + keyHost(scheme, auth) + path
	}
	key := scheme + "://" + host + target
	if req.Host != "" {
		if vh := keyHost(scheme, req.Host); vh != host {
			key += "\x00host=" + vh
		}
	}
	return key
}

// keyHost returns host in lower case, without the scheme's default port.
func keyHost(scheme, host string) string {
	host = strings.ToLower(host)
	switch {
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = strings.TrimSuffix(host, ":80")
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = strings.TrimSuffix(host, ":443")
	}
	return strings.TrimSuffix(host, ":")
}

// VariantKey is the key of the response kept for req under key, whose
// responses vary on the request headers names.
func VariantKey(key string, req *http.Request, names []string) string {
	var b strings.Builder
	b.WriteString(key)
	b.WriteString("\x00vary")
	for _, n := range names {
		b.WriteString("\x00" + n + "=" + strings.Join(headers.Values(req.Header, n), ","))
	}
	return b.String()
}

// VaryNames returns the request headers resp varies on, canonical and
// sorted, and false for Vary: *.
func VaryNames(resp *http.Response) ([]string, bool) {
	var names []string
	for _, line := range headers.Values(resp.Header, "Vary") {
		for _, n := range strings.Split(line, ",") {
			n = strings.TrimSpace(n)
			if n == "*" {
				return nil, false
			}
			if n != "" {
				names = append(names, http.CanonicalHeaderKey(n))
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), true
}

// credentialed reports whether req carries credentials: an Authorization
// or Cookie field, whatever the case of its name, or userinfo in its URL.
func credentialed(req *http.Request) bool {
	return req.URL.User != nil || opaqueUserinfo(req.URL) != "" ||
		headers.Has(req.Header, "Authorization") || headers.Has(req.Header, "Cookie")
}

// opaqueUserinfo returns the userinfo of an opaque URL that names its
// authority ("//user:pw@host/path", sent as it is), or "".
func opaqueUserinfo(u *url.URL) string {
	rest, ok := strings.CutPrefix(u.Opaque, "//")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return rest[:at]
	}
	return ""
}
