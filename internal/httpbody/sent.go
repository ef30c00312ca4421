package httpbody

import (
	"fmt"
	"io"
	"sync/atomic"
)

// A Sent is a request body on its way to the base RoundTripper. It
// notes whether its reader failed, or ended at another length than the
// request declared, so that a failure of the request itself is never
// charged to the upstream: net/http returns a body's read error as it is,
// indistinguishable by type from a connection's.
//
// The transport reads a body on a goroutine of its own, which may still be
// at it when RoundTrip returns: hence the atomics.
type Sent struct {
	io.ReadCloser
	length  int64                         // the request's ContentLength; 0 or less when unknown
	getBody func() (io.ReadCloser, error) // the attempt's GetBody, if any
	n       atomic.Int64                  // bytes read from the latest body
	eof     atomic.Bool                   // the latest body ended
	failed  atomic.Pointer[readFailure]
}

type readFailure struct{ err error }

// Track tracks body, the body of one attempt of a request of the
// given ContentLength. getBody, when not nil, is the attempt's GetBody;
// the bodies it gives (the transport may ask for one to send the request
// again on a fresh connection) are tracked too.
func Track(body io.ReadCloser, length int64, getBody func() (io.ReadCloser, error)) *Sent {
	return &Sent{ReadCloser: body, length: length, getBody: getBody}
}

func (b *Sent) Read(p []byte) (int, error) {
	return b.track(b.ReadCloser, p)
}

func (b *Sent) track(r io.Reader, p []byte) (int, error) {
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

// Rewind is the GetBody the transport sees.
func (b *Sent) Rewind() (io.ReadCloser, error) {
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
	b *Sent
}

func (r rewound) Read(p []byte) (int, error) { return r.b.track(r.ReadCloser, p) }

// Fault returns the request's own failure, if its body had one: the
// reader's error, or a length other than ContentLength.
func (b *Sent) Fault() error {
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
