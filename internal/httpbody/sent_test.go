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

func TestSentFault(t *testing.T) {
	t.Run("read whole", func(t *testing.T) {
		s := Track(io.NopCloser(strings.NewReader("abcde")), 5, nil)
		_, _ = io.ReadAll(s)
		assert.NoError(t, s.Fault())
	})
	t.Run("not read at all", func(t *testing.T) {
		s := Track(io.NopCloser(strings.NewReader("abcde")), 5, nil)
		assert.NoError(t, s.Fault(), "the upstream may answer before reading")
	})
	t.Run("shorter than declared", func(t *testing.T) {
		s := Track(io.NopCloser(strings.NewReader("abc")), 5, nil)
		_, _ = io.ReadAll(s)
		assert.ErrorContains(t, s.Fault(), "request body length (3 bytes read) does not match its ContentLength of 5")
	})
	t.Run("longer than declared", func(t *testing.T) {
		s := Track(io.NopCloser(strings.NewReader("abcdefg")), 5, nil)
		_, _ = io.ReadAll(s)
		assert.ErrorContains(t, s.Fault(), "(7 bytes read)")
	})
	t.Run("reader failed", func(t *testing.T) {
		boom := errors.New("boom")
		s := Track(io.NopCloser(io.MultiReader(strings.NewReader("ab"), iotestErr{boom})), 5, nil)
		_, err := io.ReadAll(s)
		require.ErrorIs(t, err, boom, "the reader's error passes through")
		assert.ErrorIs(t, s.Fault(), boom)
	})
	t.Run("nil", func(t *testing.T) {
		var s *Sent
		assert.NoError(t, s.Fault())
	})
}

func TestSentRewindStartsCountingAfresh(t *testing.T) {
	getBody := func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("abcde")), nil }
	s := Track(io.NopCloser(strings.NewReader("abc")), 5, getBody)
	_, _ = io.ReadAll(s)
	require.Error(t, s.Fault(), "the first body was short")
	again, err := s.Rewind()
	require.NoError(t, err)
	b, _ := io.ReadAll(again)
	assert.Equal(t, "abcde", string(b))
	assert.NoError(t, s.Fault(), "the body the transport resent was whole")

	boom := errors.New("boom")
	s = Track(io.NopCloser(strings.NewReader("abcde")), 5, func() (io.ReadCloser, error) { return nil, boom })
	_, err = s.Rewind()
	assert.ErrorIs(t, err, boom)
	assert.ErrorIs(t, s.Fault(), boom, "a GetBody that fails is the request's failure")
}

func response(body []byte, length int64) *http.Response {
	return &http.Response{StatusCode: http.StatusServiceUnavailable, ContentLength: length, Body: &closeCount{Reader: bytes.NewReader(body)}}
}

func TestDrainKeeping(t *testing.T) {
	small := pattern(1000)
	resp := response(small, -1)
	kept := DrainKeeping(resp)
	require.NotNil(t, kept)
	assert.Equal(t, 1, resp.Body.(*closeCount).closed)
	assert.Equal(t, small, readAll(t, kept.Body))
	assert.Equal(t, resp.StatusCode, kept.StatusCode)

	whole := response(pattern(MaxDrainBytes), -1)
	assert.NotNil(t, DrainKeeping(whole), "exactly MaxDrainBytes is kept")

	over := response(pattern(MaxDrainBytes+1), -1)
	assert.Nil(t, DrainKeeping(over), "one byte more is not")
	assert.Equal(t, 1, over.Body.(*closeCount).closed)

	declared := response(pattern(10), MaxDrainBytes+1)
	assert.Nil(t, DrainKeeping(declared), "declared too long: not read")
	assert.Equal(t, 1, declared.Body.(*closeCount).closed)
}

func TestDrainReadsABoundedAmount(t *testing.T) {
	r := bytes.NewReader(pattern(4 * MaxDrainBytes))
	resp := &http.Response{ContentLength: -1, Body: &closeCount{Reader: r}}
	Drain(resp)
	assert.Equal(t, 1, resp.Body.(*closeCount).closed)
	assert.EqualValues(t, 3*MaxDrainBytes-1, r.Len(), "read MaxDrainBytes+1 at most")

	r = bytes.NewReader(pattern(10))
	resp = &http.Response{ContentLength: MaxDrainBytes + 1, Body: &closeCount{Reader: r}}
	Drain(resp)
	assert.Equal(t, 10, r.Len(), "declared too long: closed unread")
}
