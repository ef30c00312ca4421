package resiliencetest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
)

// A Server is a flaky upstream for tests: an httptest server on loopback
// that answers each request with its script's next Fault, and counts the
// requests it gets and the TCP connections clients open to it.
//
// It reads each request's body before answering, as a typical upstream
// does, except when it hangs or resets. A Hang waits until the client gives
// up (its connection closes) or the Server is closed; closing the Server
// also cuts short any Delay, and the requests so cut get no response. Reset
// (and Err, which a server cannot send) hijacks the connection and closes
// it with SO_LINGER 0, so that the client sees a TCP RST. Close leaves no
// goroutine of the Server behind.
type Server struct {
	srv      *httptest.Server
	script   *Script
	requests atomic.Int64
	conns    atomic.Int64
	closed   chan struct{}
	once     sync.Once
}

// NewServer starts a Server on a loopback address that plays script; a nil
// script plays zero Faults (200 OK). Close it when done.
func NewServer(script *Script) *Server {
	s := &Server{script: script, closed: make(chan struct{})}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.srv.Start()
	return s
}

// URL returns the Server's base URL, of the form http://127.0.0.1:port.
func (s *Server) URL() string { return s.srv.URL }

// Requests reports how many requests the Server has received, whatever it
// did with them.
func (s *Server) Requests() int { return int(s.requests.Load()) }

// NewConnections reports how many TCP connections clients have opened to the
// Server: a client that reuses its connections opens few.
func (s *Server) NewConnections() int { return int(s.conns.Load()) }

// Close releases the requests that hang or wait on a Delay, shuts the Server
// down and waits for its handlers to return. It is safe to call more than
// once.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.closed)
		s.srv.Close()
	})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	f := s.script.Next()
	ctx := r.Context()
	if err := sleep(ctx, f.Delay, s.closed); err == errStopped {
		panic(http.ErrAbortHandler) // drop the connection without an answer
	} else if err != nil {
		return // the client gave up
	}
	switch {
	case f.Hang:
		select {
		case <-ctx.Done():
			return
		case <-s.closed:
			panic(http.ErrAbortHandler)
		}
	case f.Reset || f.Err != nil:
		reset(w)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	for k, v := range f.header() {
		h[k] = v
	}
	w.WriteHeader(f.status())
	_, _ = w.Write(f.Body)
}

// reset closes the request's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
