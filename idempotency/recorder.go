package idempotency

import (
	"bytes"
	"net/http"
)

// recorder buffers the handler's response, so that it can be recorded in the
// owner's transaction before any of it reaches the caller. It keeps at most
// max bytes of body; past that it drops the rest and notes the overflow.
// Handlers behind the middleware cannot stream, flush or hijack.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int64
	overflow bool
}

func newRecorder(max int64) *recorder {
	return &recorder{header: make(http.Header), max: max}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 || code < 200 {
		return // written already, or informational (not recorded)
	}
	r.status = code
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if room := r.max - int64(r.body.Len()); int64(len(p)) > room {
		r.overflow = true
		if room > 0 {
			r.body.Write(p[:room])
		}
		return len(p), nil
	}
	return r.body.Write(p)
}

// response is what the handler wrote.
func (r *recorder) response() *Response {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	return &Response{Status: status, Header: r.header, Body: r.body.Bytes()}
}

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1),
// and the ones a replay must not repeat (Set-Cookie, Date) or recomputes
// (Content-Length).
var notReplayed = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Date": true, "Content-Length": true,
}

// replayHeader is the part of h kept for replay: allow, when set, else all
// but the headers above and those the Connection header names.
func replayHeader(h http.Header, allow []string) http.Header {
	out := make(http.Header, len(h))
	if allow != nil {
		for _, name := range allow {
			name = http.CanonicalHeaderKey(name)
			if vs, ok := h[name]; ok && !notReplayed[name] {
				out[name] = append([]string(nil), vs...)
			}
		}
		return out
	}
	conn := make(map[string]bool)
	for _, v := range h.Values("Connection") {
		for _, name := range splitComma(v) {
			conn[http.CanonicalHeaderKey(name)] = true
		}
	}
	for name, vs := range h {
		if !notReplayed[name] && !conn[name] {
			out[name] = append([]string(nil), vs...)
		}
	}
	return out
}

func splitComma(s string) []string {
	var out []string
	for _, f := range bytes.Split([]byte(s), []byte(",")) {
		if f = bytes.TrimSpace(f); len(f) > 0 {
			out = append(out, string(f))
		}
	}
	return out
}
