package otelresilience

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/resilienthttp/resilience"
)

// The values of the query parameters the conventions name are redacted,
// case-sensitively, and the rest of the query stays as it was written.
func TestRedactQuery(t *testing.T) {
	for in, want := range map[string]string{
		"":                                     "",
		"q=1":                                  "q=1",
		"q=1&sig=abc":                          "q=1&sig=REDACTED",
		"X-Amz-Signature=a&X-Amz-Credential=b": "X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED",
		"X-Amz-Security-Token=t&b=%20":         "X-Amz-Security-Token=REDACTED&b=%20",
		"X-Goog-Signature=s":                   "X-Goog-Signature=REDACTED",
		"SIG=abc":                              "SIG=abc",
		"si%67=abc":                            "si%67=REDACTED",
		"sig":                                  "sig",
		"z=1&sig=&a=2":                         "z=1&sig=REDACTED&a=2",
	} {
		assert.Equal(t, want, redactQuery(in), in)
	}
}

// url.full has no userinfo; server.port is the scheme's default when the
// URL has none.
func TestAppendURL(t *testing.T) {
	u, err := url.Parse("https://user:pw@[::1]/p?sig=x#frag")
	assert.NoError(t, err)
	got := map[string]any{}
	for _, kv := range appendURL(nil, u) {
		got[string(kv.Key)] = kv.Value.AsInterface()
	}
	assert.Equal(t, map[string]any{
		"server.address": "::1",
		"server.port":    int64(443),
		"url.full":       "https://[::1]/p?sig=REDACTED#frag",
	}, got)
	assert.Equal(t, "user", u.User.Username(), "the request's URL is not touched")
}

func TestSemconvMethod(t *testing.T) {
	for _, tc := range []struct{ in, method, original string }{
		{"GET", "GET", ""},
		{"", "GET", ""},
		{"PATCH", "PATCH", ""},
		{"get", "GET", "get"},
		{"PURGE", "_OTHER", "PURGE"},
	} {
		m, o := semconvMethod(tc.in)
		assert.Equal(t, tc.method, m, tc.in)
		assert.Equal(t, tc.original, o, tc.in)
	}
}

type ownType struct{}

func (ownType) Error() string     { return "own" }
func (ownType) ErrorType() string { return "own_type" }

// baseTimeout is a timeout of a base transport's own, which says that it is
// context.DeadlineExceeded as net/http's do.
type baseTimeout struct{}

func (baseTimeout) Error() string        { return "timeout awaiting response headers" }
func (baseTimeout) Timeout() bool        { return true }
func (baseTimeout) Is(target error) bool { return target == context.DeadlineExceeded }

// error.type of an attempt that failed without a response.
func TestSpanErrorType(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{resilience.ErrAttemptTimeout, "attempt_timeout"},
		{resilience.ErrTotalTimeout, "total_timeout"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{refused, "net.OpError"},
		{&url.Error{Op: "Get", URL: "http://h/", Err: refused}, "net.OpError"},
		{fmt.Errorf("dialing: %w", refused), "net.OpError"},
		{fmt.Errorf("wrapped: %w", ownType{}), "own_type"},
		{&net.DNSError{IsTimeout: true}, "timeout"},
		// A transport's own timeout that says errors.Is DeadlineExceeded
		// (net/http's, a dial's) is not the caller's deadline: the root
		// package's ErrorType names it "timeout" too.
		{&url.Error{Op: "Get", URL: "http://h/", Err: baseTimeout{}}, "timeout"},
		{syscall.ECONNRESET, "syscall.Errno"},
		{errors.New("plain"), "errors.errorString"},
	} {
		assert.Equal(t, tc.want, spanErrorType(tc.err), "%v", tc.err)
	}
}
