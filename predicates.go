package resilience

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/resilienthttp/resilience/internal/redact"
)

// IsTransient reports whether an attempt's outcome is transient, as retries
// and the circuit breaker judge by default: status 408, 429 or 5xx but 501
// and 505, or a transport error, timeouts included; not a context's error,
// ErrTotalTimeout, ErrOverloaded, a TLS failure, a malformed request or a
// host name that does not exist (a *net.DNSError that IsNotFound; a DNS
// timeout or temporary failure is transient). It does not say whether a
// request is safe to repeat.
func IsTransient(resp *http.Response, err error) bool {
	if err != nil {
		return transientError(err)
	}
	if resp == nil {
		return false
	}
	switch c := resp.StatusCode; {
	case c == http.StatusRequestTimeout, c == http.StatusTooManyRequests:
		return true
	case c == http.StatusNotImplemented, c == http.StatusHTTPVersionNotSupported:
		return false
	default:
		return c >= 500 && c <= 599
	}
}

func transientError(err error) bool {
	switch {
	case errors.Is(err, ErrAttemptTimeout):
		return true
	case errors.Is(err, ErrTotalTimeout), errors.Is(err, ErrOverloaded), isContextError(err), isTLSFailure(err), isRequestError(err), isNameNotFound(err):
		return false
	}
	return true
}

// isNameNotFound reports whether err says that the name looked up does not
// exist: the next lookup will say so too. A lookup that timed out, or that
// a server failed for now, may pass.
func isNameNotFound(err error) bool {
	var dns *net.DNSError
	return errors.As(err, &dns) && dns.IsNotFound && !dns.IsTimeout && !dns.IsTemporary
}

// isContextError reports whether err is, or wraps, a context's own error.
// It asks for the sentinels themselves, not errors.Is: net/http's and net's
// timeouts say they are context.DeadlineExceeded too, and they are failures
// of the attempt, not the caller's deadline.
func isContextError(err error) bool {
	return redact.Walk(err, func(e error) bool {
		return e == context.Canceled || e == context.DeadlineExceeded
	})
}

func isTLSFailure(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		alert     tls.AlertError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		roots     x509.SystemRootsError
	)
	return errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &alert) ||
		errors.As(err, &authority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &roots)
}

// requestErrorPrefixes begin the errors net/http returns, as plain strings
// or unexported types, for a request it will not send as it is: checks made
// before anything reaches the network, and a body that does not match its
// ContentLength. Only the start of an error's own message is compared: the
// rest of a net/http message may quote bytes the upstream sent (a malformed
// header line, a status), and those must never steer a classification.
var requestErrorPrefixes = []string{
	"unsupported protocol scheme",
	"http: no Host in request URL",
	"http: nil Request.URL",
	"http: nil Request.Header",
	"net/http: invalid method",
	"net/http: invalid header ",
	"net/http: invalid trailer ",
	"http: invalid Host header",
	"invalid Trailer key",
	"http: ContentLength=",                                     // HTTP/1: body length differs from ContentLength
	"http2: request body larger than specified content length", // HTTP/2: the same
	"request header list larger than peer's advertised limit",  // HTTP/2: headers over the peer's limit
}

// isRequestError reports whether err is net/http's refusal of the request
// itself, judged by the start of the message of err or of an error it
// wraps.
func isRequestError(err error) bool {
	return redact.Walk(err, func(e error) bool {
		if _, ok := e.(*url.Error); ok {
			return false // its message starts with the operation and the URL
		}
		msg := e.Error()
		for _, p := range requestErrorPrefixes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	})
}
