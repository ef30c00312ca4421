package resilience

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// orRoundTripper is a base RoundTripper answering the n-th attempt (from 0)
// with f(n): a response the upstream could send but httptest cannot, or an
// error of the kind a base RoundTripper returns.
type orRoundTripper struct {
	mu sync.Mutex
	n  int
	f  func(n int) (*http.Response, error)
}

func (rt *orRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	n := rt.n
	rt.n++
	rt.mu.Unlock()
	resp, err := rt.f(n)
	if resp != nil {
		resp.Request = req
	}
	return resp, err
}

// orStatus is a 503 response whose status line is status.
func orStatus(status string) *http.Response {
	return &http.Response{
		Status: status, StatusCode: http.StatusServiceUnavailable,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody,
	}
}

// orLogger returns a logger writing every event, debug ones included, as
// text to a buffer, and a function returning what it wrote so far.
func orLogger() (*slog.Logger, func() string) {
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	w := evWriterFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return l, func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

// orOpen opens the circuit of a handler over base with n failed calls and
// returns the handler's health as served in JSON, all it logged, and the
// error of the call the open circuit rejects.
func orOpen(t *testing.T, base http.RoundTripper, n int) (h *Handler, healthJSON, logged string, rejection error) {
	t.Helper()
	logger, logs := orLogger()
	opts := cbOptions(&evRecorder{}, cbLongBreak)
	opts.CircuitBreaker.MinimumThroughput = n
	opts.CircuitBreaker.FailureRatio = 1
	opts.Logger = logger
	// A rejection is logged on its own only when listed: its line is what
	// these tests bound.
	opts.LogLevels = map[EventKind]slog.Level{EventCircuitRejected: slog.LevelError}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	client := &http.Client{Transport: h.Transport(base)}
	const target = "http://upstream.example/items"
	for i := 0; i < n; i++ {
		resp, err := client.Get(target)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	require.Equal(t, CircuitOpen, h.CircuitState())

	resp, err := client.Get(target)
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, ErrCircuitOpen)
	rejection = errors.Unwrap(err) // http.Client's *url.Error around ours
	require.NotNil(t, rejection)

	rec := httptest.NewRecorder()
	HealthHandler(h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return h, rec.Body.String(), logs(), rejection
}

// orLogLine returns the one line of logged about event kind.
func orLogLine(t *testing.T, logged string, kind EventKind) string {
	t.Helper()
	var found []string
	for _, line := range strings.Split(logged, "\n") {
		if strings.Contains(line, "event="+kind.String()+" ") {
			found = append(found, line)
		}
	}
	require.Len(t, found, 1, "log lines about %v", kind)
	return found[0]
}

// An upstream chooses its status line, and net/http accepts one of up to
// 10 MB. Eight different ones of 128 KiB made the reason, and with it every
// rejection, the health report and the log line, 1 MiB long.
func TestCircuitReasonBoundedForHugeStatusLines(t *testing.T) {
	const filler = "é€a" // runes of 2, 3 and 1 bytes: a cut by bytes would split one
	base := &orRoundTripper{f: func(n int) (*http.Response, error) {
		return orStatus(fmt.Sprintf("503 phrase%d ", n) + strings.Repeat(filler, 128<<10/len(filler))), nil
	}}
	h, healthJSON, logged, rejection := orOpen(t, base, 8)

	reason := CheckHealth(h).Handlers["cb-test"].Reason
	assert.Contains(t, reason, "8 of 8 attempts failed")
	assert.Contains(t, reason, "503 phrase7 é€a", "the most recent failure comes first")
	assert.LessOrEqual(t, len(reason), 2<<10)
	assert.True(t, utf8.ValidString(reason), "cut on a rune boundary")
	assert.Contains(t, reason, "…", "says it was cut")

	msg := rejection.Error()
	assert.Contains(t, msg, "503 phrase7")
	assert.Less(t, len(msg), 3<<10)
	assert.True(t, utf8.ValidString(msg))

	assert.Contains(t, healthJSON, "503 phrase7")
	assert.Less(t, len(healthJSON), 3<<10)

	for _, kind := range []EventKind{EventCircuitOpened, EventCircuitRejected} {
		line := orLogLine(t, logged, kind)
		assert.Contains(t, line, "503 phrase7")
		assert.Less(t, len(line), 3<<10, "the %v log line", kind)
		assert.True(t, utf8.ValidString(line))
	}
}

// Texts are bounded before they are counted: status lines that differ only
// past the bound are one failure seen several times, not several failures.
func TestCircuitReasonCountsTextsEqualWithinTheBound(t *testing.T) {
	base := &orRoundTripper{f: func(n int) (*http.Response, error) {
		return orStatus("503 " + strings.Repeat("x", 4<<10) + fmt.Sprint(n)), nil
	}}
	h, _, _, _ := orOpen(t, base, 4)
	reason := CheckHealth(h).Handlers["cb-test"].Reason
	assert.Equal(t, 1, strings.Count(reason, "503 x"), reason)
	assert.Contains(t, reason, "… (x4)")
}

// Control characters an upstream puts in its status line are escaped, so
// that they can neither start a new log line nor drive a terminal.
func TestCircuitReasonEscapesControlCharacters(t *testing.T) {
	base := &orRoundTripper{f: func(int) (*http.Response, error) {
		return orStatus("503 Busy\r\nlevel=ERROR msg=forged\x1b[2J\u202egnp.exe"), nil
	}}
	h, _, logged, rejection := orOpen(t, base, 4)
	for name, text := range map[string]string{
		"reason":    CheckHealth(h).Handlers["cb-test"].Reason,
		"rejection": rejection.Error(),
	} {
		assert.Contains(t, text, `503 Busy\r\nlevel=ERROR msg=forged\x1b[2J\u202egnp.exe (x4)`, name)
		assert.NotContains(t, text, "\n", name)
		assert.NotContains(t, text, "\x1b", name)
		assert.NotContains(t, text, "\u202e", name)
	}
	orLogLine(t, logged, EventCircuitOpened) // one line, not two
	assert.NotContains(t, logged, "\x1b")
}

// A base RoundTripper's *url.Error carries the upstream's URL, query string
// and userinfo included. The handler keeps and shows that text only with
// them redacted; the error RoundTrip returns is the caller's, unchanged.
func TestCircuitReasonRedactsURLSecrets(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	const secretURL = "http://user:pw@host.example:8080/v1/items?apiKey=SECRET&x=1#frag"
	var returned []error
	base := &orRoundTripper{f: func(n int) (*http.Response, error) {
		var err error = &url.Error{Op: "Get", URL: secretURL, Err: refused}
		if n%2 == 1 {
			err = fmt.Errorf("proxy: %w", err) // wrapped by another layer
		}
		returned = append(returned, err)
		return nil, err
	}}
	h, healthJSON, logged, rejection := orOpen(t, base, 4)

	reason := CheckHealth(h).Handlers["cb-test"].Reason
	require.NotEmpty(t, reason)
	for name, text := range map[string]string{
		"reason":      reason,
		"rejection":   rejection.Error(),
		"health JSON": healthJSON,
		"logs":        logged,
	} {
		assert.NotContains(t, text, "SECRET", name)
		assert.NotContains(t, text, "apiKey", name)
		assert.NotContains(t, text, "pw", name)
		assert.NotContains(t, text, "user", name)
		assert.NotContains(t, text, "frag", name)
		assert.Contains(t, text, "http://host.example:8080/v1/items?redacted#redacted", name)
		assert.Contains(t, text, "connection refused", name)
	}
	assert.Contains(t, reason, `Get "http://host.example:8080/v1/items?redacted#redacted": dial tcp: connect: connection refused (x2)`)
	assert.Contains(t, reason, `proxy: Get "http://host.example:8080/v1/items?redacted#redacted": dial tcp: connect: connection refused (x2)`)

	// What the base returned is untouched.
	require.Len(t, returned, 4)
	assert.Contains(t, returned[0].Error(), "apiKey=SECRET")
}
