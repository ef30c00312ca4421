package resilience

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// A sentBody is a request body on its way to the base RoundTripper. It
// notes whether its reader failed, or ended at another length than the
// request declared, so that a failure of the request itself is never
// charged to the upstream: net/http returns a body's read error as it is,
// indistinguishable by type from a connection's.
//
// The transport reads a body on a goroutine of its own, which may still be
// at it when RoundTrip returns: hence the atomics.
type sentBody struct {
	io.ReadCloser
	length  int64                         // the request's ContentLength; 0 or less when unknown
	getBody func() (io.ReadCloser, error) // the attempt's GetBody, if any
	n       atomic.Int64                  // bytes read from the latest body
	eof     atomic.Bool                   // the latest body ended
	failed  atomic.Pointer[readFailure]
}

type readFailure struct{ err error }

// attemptRequest returns the request of one attempt, a shallow copy of the
// caller's on ctx carrying body, and the sentBody that tracks it, if any.
func (c *call) attemptRequest(ctx context.Context, body io.ReadCloser, getBody func() (io.ReadCloser, error)) (*http.Request, *sentBody) {
	r := c.req.WithContext(ctx)
	if body == nil || body == http.NoBody {
		r.Body, r.GetBody = body, getBody
		return r, nil
	}
	sent := newSentBody(body, c.req.ContentLength, getBody)
	r.Body, r.GetBody = sent, nil
	if getBody != nil {
		r.GetBody = sent.rewind
	}
	return r, sent
}

// newSentBody tracks body, the body of one attempt of a request of the
// given ContentLength. getBody, when not nil, is the attempt's GetBody;
// the bodies it gives (the transport may ask for one to send the request
// again on a fresh connection) are tracked too.
func newSentBody(body io.ReadCloser, length int64, getBody func() (io.ReadCloser, error)) *sentBody {
	return &sentBody{ReadCloser: body, length: length, getBody: getBody}
}

func (b *sentBody) Read(p []byte) (int, error) {
	return b.track(b.ReadCloser, p)
}

func (b *sentBody) track(r io.Reader, p []byte) (int, error) {
	n, err := r.Read(p)
	b.n.Add(int64(n))
	switch {
	case err == io.EOF:
		b.eof.Store(true)
	case err != nil:
		b.failed.CompareAndSwap(nil, &readFailure{err})
	}
	return n, err
}

// rewind is the GetBody the transport sees.
func (b *sentBody) rewind() (io.ReadCloser, error) {
	body, err := b.getBody()
	if err != nil {
		b.failed.CompareAndSwap(nil, &readFailure{err})
		return nil, err
	}
	b.n.Store(0)
	b.eof.Store(false)
	return rewound{body, b}, nil
}

// rewound is a body that GetBody gave the transport.
type rewound struct {
	io.ReadCloser
	b *sentBody
}

func (r rewound) Read(p []byte) (int, error) { return r.b.track(r.ReadCloser, p) }

// fault returns the request's own failure, if its body had one: the
// reader's error, or a length other than ContentLength.
func (b *sentBody) fault() error {
	if b == nil {
		return nil
	}
	if f := b.failed.Load(); f != nil {
		return fmt.Errorf("reading request body: %w", f.err)
	}
	if n := b.n.Load(); b.length > 0 && (n > b.length || (n < b.length && b.eof.Load())) {
		return fmt.Errorf("request body length (%d bytes read) does not match its ContentLength of %d", n, b.length)
	}
	return nil
}
