package resilience

import (
	"errors"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/resilienthttp/resilience/internal/redact"
)

// The handler's own error is redacted like any other: the URL of the
// *url.Error it wraps loses its userinfo, query and fragment.
func TestRedactedCallError(t *testing.T) {
	base := &url.Error{Op: "Get", URL: "http://user:pw@host/p?apiKey=SECRET", Err: errors.New("connection refused")}
	err := &callError{handler: "h", kind: ErrCircuitOpen, cause: base}
	assert.Equal(t, `resilience: handler "h": circuit open: Get "http://host/p?redacted": connection refused`, redact.Error(err))
}
