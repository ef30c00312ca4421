package resilience

import (
	"net/http"
	"slices"
	"strings"

	"github.com/resilienthttp/resilience/internal/headers"
)

// What a host keeps of the answer a server-quota refusal rests on, for
// RateLimitError: the quota's name and resource, and the response without
// its body, its header bounded. It is built when the answer is kept (once
// per window, and on the answers that say nothing is left or ask for a
// pause), never on a call that is admitted.

// Bounds on a kept answer.
const (
	maxKeptHeaderBytes  = 4 << 10 // names and values of its header
	maxKeptHeaderFields = 32      // fields of its header
	maxKeptStatus       = 128     // bytes of its status line's text
)

// A serverAnswer is what is kept of an upstream's answer about its quota.
type serverAnswer struct {
	quota, resource string
	resp            *http.Response // Header bounded; no Body, no Request
}

// keepAnswer keeps resp, whose header with canonical names is h, as the
// answer of the quota named quota, scoped to resource ("" for none).
func keepAnswer(resp *http.Response, h http.Header, quota, resource string) *serverAnswer {
	status := resp.Status
	if len(status) > maxKeptStatus {
		status = status[:maxKeptStatus]
	}
	return &serverAnswer{
		quota:    strings.Clone(quota),
		resource: strings.Clone(resource),
		resp: &http.Response{
			Status:     strings.Clone(status),
			StatusCode: resp.StatusCode,
			Proto:      resp.Proto,
			ProtoMajor: resp.ProtoMajor,
			ProtoMinor: resp.ProtoMinor,
			Header:     keptHeader(h),
		},
	}
}

// quotaName is what names the quota r in an error: its policy, or the
// fields it was read from.
func quotaName(r headers.Quota) string {
	if r.Policy != "" {
		return r.Policy
	}
	return r.Fields
}

// keptHeader is a copy of h for an error to carry: the fields a quota or a
// pause is read from first, then the others in the order of their names,
// while they fit in maxKeptHeaderBytes and maxKeptHeaderFields; never a
// Set-Cookie.
func keptHeader(h http.Header) http.Header {
	names := make([]string, 0, len(h))
	for k := range h {
		if !strings.EqualFold(k, "Set-Cookie") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	out := make(http.Header, min(len(names), maxKeptHeaderFields))
	size := 0
	for _, first := range [...]bool{true, false} {
		for _, k := range names {
			if quotaField(k) != first || len(out) >= maxKeptHeaderFields {
				continue
			}
			for _, v := range h[k] {
				if size+len(k)+len(v) > maxKeptHeaderBytes {
					continue
				}
				size += len(k) + len(v)
				out[k] = append(out[k], strings.Clone(v))
			}
		}
	}
	return out
}

// quotaField reports whether the field named k is one a quota or a pause
// is read from.
func quotaField(k string) bool {
	hasPrefix := func(p string) bool { return len(k) >= len(p) && strings.EqualFold(k[:len(p)], p) }
	return hasPrefix("Ratelimit") || hasPrefix("X-Ratelimit-") ||
		strings.EqualFold(k, "Retry-After") || strings.EqualFold(k, "Date") || strings.EqualFold(k, "Age")
}

// response is the answer's response for the error of a refusal of req: a
// copy of its own, its Body http.NoBody.
func (a *serverAnswer) response(req *http.Request) *http.Response {
	r := *a.resp
	r.Header = a.resp.Header.Clone()
	r.Body = http.NoBody
	r.Request = req
	return &r
}
