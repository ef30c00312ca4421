package resilience

import (
	"net/http"
	"sync"
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
