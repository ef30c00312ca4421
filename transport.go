package resilience

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Transport is an http.RoundTripper that sends each request through a
// Handler's resilience stack to a base RoundTripper. Use it as the
// Transport of an http.Client. It never modifies the caller's request.
//
// As with http.Transport, the caller must close the response body, or read
// it to EOF: the call holds its concurrency permit and its total timeout
// until then.
type Transport struct {
	h    *Handler
	base http.RoundTripper
}

// NewTransport returns a Transport with a Handler of its own built from
// opts. A nil base means http.DefaultTransport. To share one upstream's
// state among several clients, build the Handler with NewHandler and call
// its Transport method instead.
func NewTransport(base http.RoundTripper, opts Options) (*Transport, error) {
	h, err := NewHandler(opts)
	if err != nil {
		return nil, err
	}
	return h.Transport(base), nil
}

// Handler returns the Handler whose state the Transport uses.
func (t *Transport) Handler() *Handler { return t.h }

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.h.roundTrip(t.base, req)
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// requestBody hands each attempt a fresh copy of the request body.
type requestBody struct {
	orig    io.ReadCloser                 // the caller's body; nil or http.NoBody when none
	getBody func() (io.ReadCloser, error) // the caller's GetBody, or one over buf
	buf     []byte                        // the buffered body, when buffered
	once    io.ReadCloser                 // a body that can be sent only once
	sent    bool                          // orig or once has been handed to an attempt
}

// prepare decides how req's body will be sent. It reads the body only when
// the request may be repeated and the body has no GetBody, and then holds
// at most limit bytes of it; a longer body is sent once, streamed.
func (b *requestBody) prepare(req *http.Request, repeatable bool, limit int64) error {
	b.orig = req.Body
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	if req.GetBody != nil {
		b.getBody = req.GetBody
		return nil
	}
	if !repeatable || limit < 0 || req.ContentLength > limit {
		b.once = req.Body
		return nil
	}
	var buf bytes.Buffer
	if req.ContentLength > 0 {
		buf.Grow(int(req.ContentLength))
	}
	if _, err := buf.ReadFrom(io.LimitReader(req.Body, limit)); err != nil {
		req.Body.Close()
		b.sent = true
		return fmt.Errorf("reading request body: %w", err)
	}
	if int64(buf.Len()) == limit {
		var one [1]byte
		if n, _ := io.ReadFull(req.Body, one[:]); n == 1 {
			// Longer than limit: send what was read, then the rest, once.
			b.once = readCloser{io.MultiReader(bytes.NewReader(buf.Bytes()), bytes.NewReader(one[:]), req.Body), req.Body}
			return nil
		}
	}
	req.Body.Close()
	b.sent = true
	b.buf = buf.Bytes()
	b.getBody = b.fromBuffer
	return nil
}

func (b *requestBody) fromBuffer() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.buf)), nil
}

// replayable reports whether the body can be sent again.
func (b *requestBody) replayable() bool { return b.once == nil }

// next returns the body for the next attempt and the GetBody to go with it.
func (b *requestBody) next() (io.ReadCloser, func() (io.ReadCloser, error), error) {
	switch {
	case b.once != nil:
		b.sent = true
		return b.once, nil, nil
	case b.getBody == nil:
		return b.orig, nil, nil // no body
	case !b.sent && b.buf == nil:
		b.sent = true
		return b.orig, b.getBody, nil
	}
	body, err := b.getBody()
	if err != nil {
		return nil, nil, fmt.Errorf("getting request body for another attempt: %w", err)
	}
	return body, b.getBody, nil
}

// close closes the caller's body if no attempt took it: RoundTrip must
// close it even when it sends nothing.
func (b *requestBody) close() {
	if !b.sent && b.orig != nil && b.orig != http.NoBody {
		b.sent = true
		b.orig.Close()
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// Bounds on draining a response that is retried: enough to keep the
// connection for an ordinary error page, never enough to stall the retry.
const (
	maxDrainBytes = 64 << 10
	maxDrainTime  = 100 * time.Millisecond
)

// drain reads what is left of a response body that will not be returned,
// up to maxDrainBytes, and closes it, so that its connection goes back to
// the pool. The caller bounds the time it takes.
func drain(resp *http.Response) {
	if resp.ContentLength <= maxDrainBytes {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrainBytes+1)
	}
	_ = resp.Body.Close()
}
