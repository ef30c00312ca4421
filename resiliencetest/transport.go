package resiliencetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// A Transport is an http.RoundTripper that plays a Script without a
// network: each request gets the script's next Fault.
//
//   - Delay waits, or returns ctx.Err() if the request's context ends first.
//   - Hang returns ctx.Err() once the request's context is done; a request
//     whose context never ends hangs for good.
//   - Reset returns a *net.OpError wrapping syscall.ECONNRESET, as a
//     connection reset by the peer does.
//   - Err is returned as is.
//   - A Fault with Status, RetryAfter or Body set gets a response made here,
//     without calling the base.
//   - Any other Fault (zero, or only a Delay) passes the request to the
//     base RoundTripper; with a nil base it gets a 200 OK with an empty body.
//
// Like any RoundTripper it closes the request body when it does not pass the
// request on. It is safe for concurrent use.
type Transport struct {
	base     http.RoundTripper
	script   *Script
	requests atomic.Int64
}

// NewTransport returns a Transport that plays script in front of base. A nil
// base answers 200 OK itself; a nil script plays zero Faults.
func NewTransport(base http.RoundTripper, script *Script) *Transport {
	return &Transport{base: base, script: script}
}

// Requests reports how many requests the Transport has been given.
func (t *Transport) Requests() int { return int(t.requests.Load()) }

// CloseIdleConnections closes the idle connections of the base, if it has
// such a method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.requests.Add(1)
	f := t.script.Next()
	ctx := req.Context()
	if err := sleep(ctx, f.Delay, nil); err != nil {
		closeBody(req)
		return nil, err
	}
	switch {
	case f.Hang:
		<-ctx.Done()
		closeBody(req)
		return nil, ctx.Err()
	case f.Reset:
		closeBody(req)
		return nil, resetError(req)
	case f.Err != nil:
		closeBody(req)
		return nil, f.Err
	case f.Status == 0 && f.RetryAfter == "" && f.Body == nil && t.base != nil:
		return t.base.RoundTrip(req)
	}
	closeBody(req)
	return f.response(req), nil
}

// sleep waits d, or until ctx is done (it returns ctx.Err()) or stop is
// closed (it returns errStopped).
func sleep(ctx context.Context, d time.Duration, stop <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return errStopped
	}
}

var errStopped = errors.New("resiliencetest: server closed")

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// resetError is the error a read from a connection the peer reset returns.
func resetError(req *http.Request) error {
	host := req.URL.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		port := "80"
		if req.URL.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(req.URL.Hostname(), port)
	}
	return &net.OpError{Op: "read", Net: "tcp", Addr: tcpAddr(host), Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}

// tcpAddr is the peer's address as the request names it.
type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }

// status is the Fault's status code, 200 when unset.
func (f Fault) status() int {
	if f.Status == 0 {
		return http.StatusOK
	}
	return f.Status
}

// header is the header of the Fault's response.
func (f Fault) header() http.Header {
	h := make(http.Header, 3)
	if f.RetryAfter != "" {
		h.Set("Retry-After", f.RetryAfter)
	}
	if len(f.Body) > 0 {
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	h.Set("Content-Length", strconv.Itoa(len(f.Body)))
	return h
}

// response is the Fault's response to req, as a Transport makes it.
func (f Fault) response(req *http.Request) *http.Response {
	code := f.status()
	var body io.ReadCloser = http.NoBody
	if len(f.Body) > 0 {
		body = io.NopCloser(bytes.NewReader(f.Body))
	}
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code) // as net/http says it
	}
	return &http.Response{
		Status:        strconv.Itoa(code) + " " + text,
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        f.header(),
		Body:          body,
		ContentLength: int64(len(f.Body)),
		Request:       req,
	}
}
