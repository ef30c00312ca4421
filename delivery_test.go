package resilience

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readerBase answers every request with 200 and a body that body makes.
type readerBase struct{ body func() io.ReadCloser }

func (b readerBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: b.body(), Request: r}, nil
}

// onlyReader hides every method of its reader but Read.
type onlyReader struct{ io.Reader }

// failingWriter fails every write.
type failingWriter struct{}

var errWriterFailed = errors.New("writer failed")

func (failingWriter) Write([]byte) (int, error) { return 0, errWriterFailed }

// A delivered body is an io.WriterTo exactly when the base's body is one,
// and io.Copy through it ends the call as reading to EOF does: the permit
// comes back without a Close, and a failed writer ends it too.
func TestDeliveredBodyKeepsWriterTo(t *testing.T) {
	t.Parallel()
	inMemory := readerBase{func() io.ReadCloser { return io.NopCloser(strings.NewReader("hello")) }}
	tr, err := NewTransport(inMemory, Options{RateLimit: RateLimitOptions{MaxConcurrent: 1}})
	require.NoError(t, err)
	c := &http.Client{Transport: tr}

	resp, err := c.Get("http://upstream.invalid/")
	require.NoError(t, err)
	require.Implements(t, (*io.WriterTo)(nil), resp.Body)
	_, err = c.Get("http://upstream.invalid/")
	require.ErrorIs(t, err, ErrRateLimited, "the body unread holds the permit")
	var buf bytes.Buffer
	n, err := io.Copy(&buf, resp.Body)
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	assert.Equal(t, "hello", buf.String())

	resp, err = c.Get("http://upstream.invalid/")
	require.NoError(t, err, "io.Copy to the end gave the permit back")
	_, err = io.Copy(failingWriter{}, resp.Body)
	require.ErrorIs(t, err, errWriterFailed)
	resp, err = c.Get("http://upstream.invalid/")
	require.NoError(t, err, "a failed io.Copy ended the call")
	require.NoError(t, resp.Body.Close())

	streamed := readerBase{func() io.ReadCloser { return io.NopCloser(onlyReader{strings.NewReader("hello")}) }}
	tr, err = NewTransport(streamed, Options{})
	require.NoError(t, err)
	resp, err = (&http.Client{Transport: tr}).Get("http://upstream.invalid/")
	require.NoError(t, err)
	defer resp.Body.Close()
	_, ok := resp.Body.(io.WriterTo)
	assert.False(t, ok, "a body that is no io.WriterTo is not made to look like one")
	assert.Equal(t, "hello", readBody(t, resp))
}

// closingReader is an in-memory body, an io.WriterTo, that fails once
// closed, as net/http's bodies do.
type closingReader struct {
	*strings.Reader
	closed bool
}

var errClosingReaderClosed = errors.New("read on closed body")

func (r *closingReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, errClosingReaderClosed
	}
	return r.Reader.Read(p)
}

func (r *closingReader) WriteTo(w io.Writer) (int64, error) {
	if r.closed {
		return 0, errClosingReaderClosed
	}
	return r.Reader.WriteTo(w)
}

func (r *closingReader) Close() error {
	r.closed = true
	return nil
}

// pastEnd is what a body says when read to its end and on: the data, then
// each further call's result, as text so that bare and handler compare.
type pastEnd struct {
	Data        string
	AfterEOF    [2]string // two Reads after the end
	WriteTo     string    // a WriteTo after the end, for an io.WriterTo
	Close       string
	AfterClose  string // a Read after the caller's Close
	WriteToGone string // a WriteTo after the caller's Close, for an io.WriterTo
}

func result(n int64, err error) string {
	if err == nil {
		return fmt.Sprintf("%d, <nil>", n)
	}
	return fmt.Sprintf("%d, %v", n, err)
}

// readPastEnd reads body to its end, through WriteTo (io.Copy) when viaCopy
// is set and body is an io.WriterTo, and on past it, then closes it and
// reads again.
func readPastEnd(t *testing.T, body io.ReadCloser, viaCopy bool) pastEnd {
	t.Helper()
	var got pastEnd
	var buf bytes.Buffer
	var err error
	if viaCopy {
		_, err = io.Copy(&buf, body)
	} else {
		_, err = buf.ReadFrom(onlyReader{body}) // Read after Read, to io.EOF
	}
	require.NoError(t, err)
	got.Data = buf.String()
	p := make([]byte, 8)
	for i := range got.AfterEOF {
		n, err := body.Read(p)
		got.AfterEOF[i] = result(int64(n), err)
	}
	wt, isWT := body.(io.WriterTo)
	if isWT {
		got.WriteTo = result(wt.WriteTo(&buf))
	}
	if err := body.Close(); err != nil {
		got.Close = err.Error()
	}
	n, err := body.Read(p)
	got.AfterClose = result(int64(n), err)
	if isWT {
		got.WriteToGone = result(wt.WriteTo(&buf))
	}
	return got
}

// Reading past the end of a delivered body gives io.EOF again, as
// net/http's own body does and the io.Reader contract expects (go-openai's
// stream reader reads once more after the end), whether the end came by
// Read or by io.Copy through WriteTo; a Read after the caller's Close gives
// what the base's body gives. Over HTTP/1.1 and HTTP/2, each compared with
// the bare transport's body in the same test; the end of the body still
// ends the call (the permit comes back without a Close).
func TestDeliveredBodyPastItsEnd(t *testing.T) {
	t.Parallel()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("chunked") {
			_, _ = io.WriteString(w, "hello, ")
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "world")
	})
	h1 := httptest.NewServer(handler)
	defer h1.Close()
	h2 := httptest.NewUnstartedServer(handler)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	defer h2.Close()

	for _, up := range []struct {
		name  string
		srv   *httptest.Server
		proto int
	}{{"HTTP/1.1", h1, 1}, {"HTTP/2", h2, 2}} {
		for _, query := range []string{"", "?chunked"} {
			t.Run(up.name+query, func(t *testing.T) {
				base := up.srv.Client().Transport.(*http.Transport).Clone()
				defer base.CloseIdleConnections()
				tr, err := NewTransport(base, Options{RateLimit: RateLimitOptions{MaxConcurrent: 1}})
				require.NoError(t, err)

				resp, err := (&http.Client{Transport: base}).Get(up.srv.URL + query)
				require.NoError(t, err)
				require.Equal(t, up.proto, resp.ProtoMajor)
				bare := readPastEnd(t, resp.Body, false)
				assert.Equal(t, "0, EOF", bare.AfterEOF[1], "net/http's own body, past its end")

				c := &http.Client{Transport: tr}
				resp, err = c.Get(up.srv.URL + query)
				require.NoError(t, err)
				var buf bytes.Buffer
				_, err = buf.ReadFrom(onlyReader{resp.Body})
				require.NoError(t, err)
				p := make([]byte, 8)
				n, err := resp.Body.Read(p)
				assert.Equal(t, "0, EOF", result(int64(n), err))
				second, err := c.Get(up.srv.URL + query)
				require.NoError(t, err, "the end of the body ended the call: its permit came back without a Close")
				require.NoError(t, resp.Body.Close())
				assert.Equal(t, bare, readPastEnd(t, second.Body, false), "as the bare transport's body")
			})
		}
	}
}

// The same through WriteTo, over a base whose bodies are io.WriterTo (an
// in-memory one), compared with the base's own body: after io.Copy, a Read
// gives io.EOF and a WriteTo writes nothing and no error.
func TestDeliveredWriterToPastItsEnd(t *testing.T) {
	t.Parallel()
	inMemory := readerBase{func() io.ReadCloser { return &closingReader{Reader: strings.NewReader("hello")} }}
	bareResp, err := inMemory.RoundTrip(nil)
	require.NoError(t, err)
	bare := readPastEnd(t, bareResp.Body, true)
	require.Equal(t, "0, <nil>", bare.WriteTo, "the base's own body, past its end")

	tr, err := NewTransport(inMemory, Options{RateLimit: RateLimitOptions{MaxConcurrent: 1}})
	require.NoError(t, err)
	c := &http.Client{Transport: tr}
	for _, viaCopy := range []bool{true, false} {
		resp, err := c.Get("http://upstream.invalid/")
		require.NoError(t, err)
		require.Implements(t, (*io.WriterTo)(nil), resp.Body)
		assert.Equal(t, bare, readPastEnd(t, resp.Body, viaCopy), "io.Copy: %v", viaCopy)
	}
	// After io.Copy alone, with no Close: reads past the end, and the
	// permit is back.
	resp, err := c.Get("http://upstream.invalid/")
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	n, err := resp.Body.Read(make([]byte, 8))
	assert.Equal(t, "0, EOF", result(int64(n), err))
	written, err := resp.Body.(io.WriterTo).WriteTo(io.Discard)
	assert.Equal(t, "0, <nil>", result(written, err))
	other, err := c.Get("http://upstream.invalid/")
	require.NoError(t, err, "io.Copy to the end gave the permit back")
	require.NoError(t, other.Body.Close())
	require.NoError(t, resp.Body.Close())
}
