package resilience

import (
	"net/http"
	"sync"
)

// Transport is an http.RoundTripper that sends each request through a
// Handler to a base RoundTripper, never modifying it. The zero Transport is
// the standard handler over http.DefaultTransport. As with http.Transport,
// close the response body or read it to EOF, and do not copy one in use.
type Transport struct {
	h    *Handler
	base http.RoundTripper
	once sync.Once // makes the zero value's handler
}

// NewTransport returns a Transport over base (nil: http.DefaultTransport)
// with a Handler of its own; to share one, use [Handler.Transport].
func NewTransport(base http.RoundTripper, opts Options) (*Transport, error) {
	h, err := NewHandler(opts)
	if err != nil {
		return nil, err
	}
	return h.Transport(base), nil
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

// CloseIdleConnections calls the base's CloseIdleConnections, if any.
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
