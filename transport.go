package resilience

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Transport is an http.RoundTripper that sends each request through a
// Handler's resilience stack to a base RoundTripper. Use it as the
// Transport of an http.Client. It never modifies the caller's request.
//
// As with http.Transport, the caller must close the response body, or read
// it to EOF: the call holds its concurrency permit and its total timeout
// until then.
//
// The zero value is ready to use: &Transport{} is the standard handler
// (Options{}) over http.DefaultTransport, made on first use. Like
// http.Transport, a Transport must not be copied after first use.
type Transport struct {
	h    *Handler
	base http.RoundTripper
	once sync.Once // makes the zero value's handler
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

// NewHedgingTransport returns a Transport with the standard hedging handler,
// the counterpart of .NET's AddStandardHedgingHandler: the total timeout,
// then hedging (one more attempt after 2s by default, up to 10), and inside,
// per authority, a concurrency limit, a circuit breaker and the attempt
// timeout. It is NewTransport with Hedging.Enabled and PerHost.Enabled set;
// the other fields of opts mean what they mean there.
func NewHedgingTransport(base http.RoundTripper, opts Options) (*Transport, error) {
	opts.Hedging.Enabled = true
	opts.PerHost.Enabled = true
	return NewTransport(base, opts)
}

// Handler returns the Handler whose state the Transport uses.
func (t *Transport) Handler() *Handler {
	t.init()
	return t.h
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	return t.h.roundTrip(t.base, req)
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method.
func (t *Transport) CloseIdleConnections() {
	t.init()
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// init makes the zero value the standard handler over
// http.DefaultTransport. A Transport made by NewTransport or
// Handler.Transport has both already, and pays one atomic load.
func (t *Transport) init() {
	t.once.Do(func() {
		if t.h == nil {
			t.h, _ = NewHandler(Options{}) // the defaults are valid
		}
		if t.base == nil {
			t.base = http.DefaultTransport
		}
	})
}

// requestBody hands each attempt a fresh copy of the request body.
type requestBody struct {
	orig    io.ReadCloser                 // the caller's body; nil or http.NoBody when none
	getBody func() (io.ReadCloser, error) // the caller's GetBody, or one over buf
	chunks  [][]byte                      // the buffered body, when buffered
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
	chunks, complete, err := readUpTo(req.Body, limit, req.ContentLength)
	if err != nil {
		req.Body.Close()
		b.sent = true
		return fmt.Errorf("reading request body: %w", err)
	}
	if !complete {
		// Longer than limit: send what was read, then the rest, once.
		b.once = readCloser{io.MultiReader(&chunkReader{chunks: chunks}, req.Body), req.Body}
		return nil
	}
	req.Body.Close()
	b.sent = true
	b.chunks = chunks
	b.getBody = b.fromBuffer
	return nil
}

// bodyChunk is the size of the pieces a body of unknown length is buffered
// in: growing one buffer by doubling would allocate twice what it keeps.
const bodyChunk = 32 << 10

// readUpTo reads r until EOF or until it holds limit bytes, in chunks of at
// most bodyChunk bytes, or one chunk for a declared length. complete reports
// that r ended within the limit; if not, the chunks hold what was read,
// one byte past the limit at most.
func readUpTo(r io.Reader, limit, length int64) (chunks [][]byte, complete bool, err error) {
	var held int64
	for {
		if held >= limit || (length > 0 && held >= length) {
			// One more byte tells whether the body ends here.
			var one [1]byte
			n, err := io.ReadFull(r, one[:])
			switch {
			case n == 1:
				return append(chunks, []byte{one[0]}), false, nil
			case err == io.EOF:
				return chunks, true, nil
			}
			return chunks, false, err
		}
		size := min(bodyChunk, limit-held)
		if length > 0 && held == 0 {
			size = min(length, limit)
		}
		buf := make([]byte, size)
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			chunks = append(chunks, buf[:n])
			held += int64(n)
		}
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return chunks, true, nil
		default:
			return chunks, false, err
		}
	}
}

// chunkReader reads a buffered body without consuming the chunks, so that
// every attempt can have its own.
type chunkReader struct {
	chunks [][]byte
	i, off int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for r.i < len(r.chunks) && r.off == len(r.chunks[r.i]) {
		r.i, r.off = r.i+1, 0
	}
	if r.i == len(r.chunks) {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[r.i][r.off:])
	r.off += n
	return n, nil
}

func (b *requestBody) fromBuffer() (io.ReadCloser, error) {
	return io.NopCloser(&chunkReader{chunks: b.chunks}), nil
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
	case !b.sent && b.chunks == nil:
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

// drainKeeping is drain, keeping what it reads: when that is the whole
// body, it returns a copy of resp with the body in memory.
func drainKeeping(resp *http.Response) *http.Response {
	if resp.ContentLength > maxDrainBytes {
		_ = resp.Body.Close()
		return nil
	}
	var buf bytes.Buffer
	n, err := io.CopyN(&buf, resp.Body, maxDrainBytes+1)
	_ = resp.Body.Close()
	if err != io.EOF || n > maxDrainBytes {
		return nil
	}
	kept := *resp
	kept.Body = io.NopCloser(bytes.NewReader(buf.Bytes()))
	return &kept
}
