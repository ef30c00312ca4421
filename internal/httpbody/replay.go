// Package httpbody carries a request body across the attempts of a call and
// disposes of the response bodies that are not returned: it buffers a
// body that may be sent again (Replay), tracks what the base RoundTripper
// read of the one it sends, so that a failure of the request itself is told
// from the upstream's (Sent), and drains a retried response, bounded, so
// that its connection goes back to the pool (Drain).
package httpbody

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"time"
)

// A Replay hands each attempt of a call a fresh copy of the request
// body. Its zero value holds no body; Hold or Prepare gives it one.
type Replay struct {
	orig     io.ReadCloser                 // the caller's body; nil or http.NoBody when none
	getBody  func() (io.ReadCloser, error) // the caller's GetBody, or one over buf
	chunks   [][]byte                      // the buffered body, when buffered
	once     io.ReadCloser                 // a body that can be sent only once
	sent     bool                          // orig or once has been handed to an attempt
	prepared bool                          // Prepare has run
}

// Prepared reports whether Prepare has run.
func (b *Replay) Prepared() bool { return b.prepared }

// Prepare decides how req's body will be sent. It reads the body only when
// the request may be repeated and the body has no GetBody, and then holds
// at most limit bytes of it; a longer body is sent once, streamed.
func (b *Replay) Prepare(req *http.Request, repeatable bool, limit int64) error {
	b.prepared = true
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

func (b *Replay) fromBuffer() (io.ReadCloser, error) {
	return io.NopCloser(&chunkReader{chunks: b.chunks}), nil
}

// Replayable reports whether the body can be sent again.
func (b *Replay) Replayable() bool { return b.once == nil }

// Next returns the body for the next attempt and the GetBody to go with it.
func (b *Replay) Next() (io.ReadCloser, func() (io.ReadCloser, error), error) {
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

// Hold keeps the caller's body, to be closed by Close if no attempt
// takes it, before Prepare has decided how to send it.
func (b *Replay) Hold(body io.ReadCloser) { b.orig = body }

// Close closes the caller's body if no attempt took it: RoundTrip must
// close it even when it sends nothing.
func (b *Replay) Close() {
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
	MaxDrainBytes = 64 << 10
	MaxDrainTime  = 100 * time.Millisecond
)

// Drain reads what is left of a response body that will not be returned,
// up to MaxDrainBytes, and closes it, so that its connection goes back to
// the pool. The caller bounds the time it takes.
func Drain(resp *http.Response) {
	if resp.ContentLength <= MaxDrainBytes {
		_, _ = io.CopyN(io.Discard, resp.Body, MaxDrainBytes+1)
	}
	_ = resp.Body.Close()
}

// DrainKeeping is Drain, keeping what it reads: when that is the whole
// body, it returns a copy of resp with the body in memory.
func DrainKeeping(resp *http.Response) *http.Response {
	if resp.ContentLength > MaxDrainBytes {
		_ = resp.Body.Close()
		return nil
	}
	var buf bytes.Buffer
	n, err := io.CopyN(&buf, resp.Body, MaxDrainBytes+1)
	_ = resp.Body.Close()
	if err != io.EOF || n > MaxDrainBytes {
		return nil
	}
	kept := *resp
	kept.Body = io.NopCloser(bytes.NewReader(buf.Bytes()))
	return &kept
}
