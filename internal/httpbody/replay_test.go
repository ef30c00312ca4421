package httpbody

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

// pattern returns n bytes that differ from one position to the next, so
// that a chunk read out of order or twice shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func joined(chunks [][]byte) []byte { return bytes.Join(chunks, nil) }

func TestReadUpToBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name          string
		size, limit   int64
		length        int64 // declared; 0 for unknown
		complete      bool
		held          int64 // bytes in the chunks
		maxChunkBytes int64
	}{
		{"empty", 0, 100, 0, true, 0, 0},
		{"under the limit", 99, 100, 0, true, 99, 100},
		{"exactly the limit", 100, 100, 0, true, 100, 100},
		{"one byte past the limit", 101, 100, 0, false, 101, 100},
		{"far past the limit", 10_000, 100, 0, false, 101, 100},
		{"unknown length, several chunks", 3*bodyChunk + 7, 1 << 20, 0, true, 3*bodyChunk + 7, bodyChunk},
		{"unknown length, past the limit on a chunk boundary", 2*bodyChunk + 1, 2 * bodyChunk, 0, false, 2*bodyChunk + 1, bodyChunk},
		{"declared length: one chunk", 3*bodyChunk + 7, 1 << 20, 3*bodyChunk + 7, true, 3*bodyChunk + 7, 3*bodyChunk + 7},
		{"declared length, longer than declared", 120, 1 << 20, 100, false, 101, 100},
		{"declared length, shorter than declared", 80, 1 << 20, 100, true, 80, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := pattern(int(tc.size))
			chunks, complete, err := readUpTo(bytes.NewReader(src), tc.limit, tc.length)
			require.NoError(t, err)
			assert.Equal(t, tc.complete, complete)
			got := joined(chunks)
			assert.Len(t, got, int(tc.held))
			assert.Equal(t, src[:tc.held], got, "the bytes, in order")
			for _, c := range chunks {
				assert.LessOrEqual(t, int64(cap(c)), max(tc.maxChunkBytes, 1), "chunk size")
			}
		})
	}
}

func TestReadUpToReaderError(t *testing.T) {
	boom := errors.New("boom")
	_, complete, err := readUpTo(io.MultiReader(strings.NewReader("abc"), iotestErr{boom}), 100, 0)
	assert.ErrorIs(t, err, boom)
	assert.False(t, complete)
}

type iotestErr struct{ err error }

func (r iotestErr) Read([]byte) (int, error) { return 0, r.err }

// closeCount is a body that counts its Close calls.
type closeCount struct {
	io.Reader
	closed int
}

func (b *closeCount) Close() error { b.closed++; return nil }

func request(t *testing.T, body io.ReadCloser, length int64) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://upstream.example/", body)
	require.NoError(t, err)
	req.ContentLength, req.GetBody = length, nil
	return req
}

func readAll(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}

func TestReplayBuffersAndHandsEachAttemptACopy(t *testing.T) {
	src := pattern(2*bodyChunk + 5)
	orig := &closeCount{Reader: bytes.NewReader(src)}
	var r Replay
	require.NoError(t, r.Prepare(request(t, orig, -1), true, 1<<20))
	assert.Equal(t, 1, orig.closed, "the caller's body is closed once buffered")
	assert.True(t, r.Replayable())
	for i := 0; i < 3; i++ {
		body, getBody, err := r.Next()
		require.NoError(t, err)
		require.NotNil(t, getBody, "the transport may resend on a fresh connection")
		assert.Equal(t, src, readAll(t, body), "attempt %d", i)
		again, err := getBody()
		require.NoError(t, err)
		assert.Equal(t, src, readAll(t, again), "GetBody of attempt %d", i)
	}
	r.Close()
	assert.Equal(t, 1, orig.closed)
}

func TestReplayLongerThanTheLimitIsSentOnceWhole(t *testing.T) {
	src := pattern(1000)
	orig := &closeCount{Reader: bytes.NewReader(src)}
	var r Replay
	require.NoError(t, r.Prepare(request(t, orig, -1), true, 100))
	assert.False(t, r.Replayable())
	body, getBody, err := r.Next()
	require.NoError(t, err)
	assert.Nil(t, getBody)
	assert.Equal(t, src, readAll(t, body), "what was read, then the rest")
	require.NoError(t, body.Close())
	assert.Equal(t, 1, orig.closed, "closing the attempt's body closes the caller's")
	r.Close()
	assert.Equal(t, 1, orig.closed, "taken by an attempt: not closed again")
}

func TestReplayDeclaredLongerThanTheLimitIsNotRead(t *testing.T) {
	orig := &closeCount{Reader: bytes.NewReader(pattern(1000))}
	var r Replay
	require.NoError(t, r.Prepare(request(t, orig, 1000), true, 100))
	assert.False(t, r.Replayable())
	body, _, err := r.Next()
	require.NoError(t, err)
	assert.Same(t, orig, body, "streamed as it is")
}

func TestReplayNotRepeatableIsSentOnce(t *testing.T) {
	orig := &closeCount{Reader: strings.NewReader("x")}
	var r Replay
	require.NoError(t, r.Prepare(request(t, orig, 1), false, 1<<20))
	assert.False(t, r.Replayable())
	body, _, err := r.Next()
	require.NoError(t, err)
	assert.Same(t, orig, body)
	assert.Zero(t, orig.closed)
}

func TestReplayUsesTheCallersGetBody(t *testing.T) {
	orig := &closeCount{Reader: strings.NewReader("first")}
	req := request(t, orig, 5)
	gets := 0
	req.GetBody = func() (io.ReadCloser, error) { gets++; return io.NopCloser(strings.NewReader("again")), nil }
	var r Replay
	require.NoError(t, r.Prepare(req, true, 1<<20))
	body, _, err := r.Next()
	require.NoError(t, err)
	assert.Same(t, orig, body, "the first attempt sends the caller's own body")
	body, _, err = r.Next()
	require.NoError(t, err)
	assert.Equal(t, "again", string(readAll(t, body)))
	assert.Equal(t, 1, gets)

	boom := errors.New("boom")
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	r = Replay{}
	require.NoError(t, r.Prepare(req, true, 1<<20))
	_, _, _ = r.Next()
	_, _, err = r.Next()
	assert.ErrorIs(t, err, boom)
}

func TestReplayCloseClosesAnUnsentBody(t *testing.T) {
	orig := &closeCount{Reader: strings.NewReader("x")}
	var r Replay
	r.Hold(orig)
	r.Close()
	r.Close()
	assert.Equal(t, 1, orig.closed, "closed once, though nothing was sent")

	var none Replay
	none.Close() // no body: nothing to do
}

func TestReplayReadErrorClosesTheBody(t *testing.T) {
	boom := errors.New("boom")
	orig := &closeCount{Reader: io.MultiReader(strings.NewReader("abc"), iotestErr{boom})}
	var r Replay
	err := r.Prepare(request(t, orig, -1), true, 1<<20)
	assert.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "reading request body")
	assert.Equal(t, 1, orig.closed)
	r.Close()
	assert.Equal(t, 1, orig.closed)
}
