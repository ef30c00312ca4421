package resilience

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// IsTransient is the standard classification of an attempt's outcome, the
// one the retry layer and the circuit breaker use unless told otherwise:
//
//   - a response with status 408, 429, or 5xx other than 501 and 505;
//   - a transport error, including an attempt timeout (ErrAttemptTimeout);
//
// but never caller cancellation or a caller's deadline, the total timeout
// (ErrTotalTimeout), a TLS certificate or handshake failure, or a request
// the transport refused as malformed (unsupported scheme, missing host,
// invalid method or header): repeating those cannot help.
//
// IsTransient says nothing about whether a request is safe to repeat; the
// method rule decides that.
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
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// ErrTotalTimeout and the caller's own deadline land here.
		return false
	case isTLSFailure(err), isMalformed(err):
		return false
	}
	return true
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

// malformedMessages are the errors net/http returns, as unexported types or
// plain strings, for a request it will never send.
var malformedMessages = []string{
	"unsupported protocol scheme",
	"no Host in request URL",
	"nil Request.URL",
	"nil Request.Header",
	"invalid method",
	"invalid header field",
	"invalid Host header",
	"invalid Trailer",
}

func isMalformed(err error) bool {
	// Match the transport's own message, not the URL a *url.Error adds.
	var ue *url.Error
	for errors.As(err, &ue) && ue.Err != nil {
		err = ue.Err
	}
	msg := err.Error()
	for _, m := range malformedMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}
