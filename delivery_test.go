package resilience

import (
	"bytes"
	"errors"
	"io"
	"net/http"
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
