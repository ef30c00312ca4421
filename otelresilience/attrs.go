package otelresilience

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/resilienthttp/resilience"
)

// Attribute keys.
const (
	keyHandler  = attribute.Key("resilience.handler")
	keyEvent    = attribute.Key("resilience.event")
	keyEndpoint = attribute.Key("resilience.endpoint")
	keyAttempt  = attribute.Key("resilience.attempt")
	keyOutcome  = attribute.Key("resilience.outcome")
	keyMethod   = attribute.Key("http.request.method")
	keyStatus   = attribute.Key("http.response.status_code")
	keyErrType  = attribute.Key("error.type")
	keyAddress  = attribute.Key("server.address")
	keyPort     = attribute.Key("server.port")
	keyScheme   = attribute.Key("url.scheme")
)

// Outcomes.
const (
	outcomeSuccess  = "success"
	outcomeFailure  = "failure"
	outcomeTimeout  = "timeout"
	outcomeCanceled = "canceled"
	outcomeRejected = "rejected"
)

// Error types the handler's own errors and the context's map to.
const (
	errAttemptTimeout   = "attempt_timeout"
	errTotalTimeout     = "total_timeout"
	errCircuitOpen      = "circuit_open"
	errRateLimited      = "rate_limited"
	errOverloaded       = "overloaded"
	errBudgetExhausted  = "budget_exhausted"
	errCanceled         = "canceled"
	errDeadlineExceeded = "deadline_exceeded"
	errTimeout          = "timeout"
	errIsolated         = "isolated"
)

// A setKey is every attribute value a measurement can have. The values are
// strings the event already holds or constants, so making one allocates
// nothing; the attribute set it stands for is built once, on first use.
type setKey struct {
	kind     resilience.EventKind
	attempt  int
	status   int
	handler  string
	method   string
	errType  string
	host     string
	endpoint string // the configured base URL of a routed attempt's endpoint
}

// maxCachedSets bounds each cache: past it, the cache starts afresh, so a
// PerHost handler calling ever new hosts cannot grow it without end.
const maxCachedSets = 2048

// A setCache maps a setKey to the options that carry its attribute set.
// Lookups of known keys read an immutable map without a lock; new keys go
// to pending, under mu, and are promoted into a new read map once the
// lookups that missed it add up to its size, as sync.Map does with its
// dirty map: copies cost O(1) amortized per miss. A typed map hashes the
// key about twice as fast as sync.Map, which hashes it through an interface.
type setCache struct {
	read    atomic.Pointer[map[setKey]*setOpts]
	mu      sync.Mutex
	pending map[setKey]*setOpts
	misses  int
}

// setOpts holds an attribute set as the option slices the instruments'
// methods take, ready to pass with ...: a slice made at the call would
// escape to the heap through the interface method.
type setOpts struct {
	add     []metric.AddOption
	record  []metric.RecordOption
	observe []metric.ObserveOption
}

func (c *setCache) get(k setKey, build func(setKey) attribute.Set) *setOpts {
	if read := c.read.Load(); read != nil {
		if o := (*read)[k]; o != nil {
			return o
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var read map[setKey]*setOpts
	if p := c.read.Load(); p != nil {
		read = *p
	}
	if o := read[k]; o != nil {
		return o // promoted meanwhile
	}
	o := c.pending[k]
	if o == nil {
		if len(read)+len(c.pending) >= maxCachedSets {
			read, c.pending, c.misses = nil, nil, 0
			c.read.Store(nil)
		}
		opt := metric.WithAttributeSet(build(k))
		o = &setOpts{
			add:     []metric.AddOption{opt},
			record:  []metric.RecordOption{opt},
			observe: []metric.ObserveOption{opt},
		}
		if c.pending == nil {
			c.pending = make(map[setKey]*setOpts)
		}
		c.pending[k] = o
	}
	if c.misses++; c.misses >= len(read) {
		m := make(map[setKey]*setOpts, len(read)+len(c.pending))
		for k, v := range read {
			m[k] = v
		}
		for k, v := range c.pending {
			m[k] = v
		}
		c.read.Store(&m)
		c.pending, c.misses = nil, 0
	}
	return o
}

// The attribute sets of each instrument.

func eventSet(k setKey) attribute.Set {
	kv := make([]attribute.KeyValue, 0, 8)
	kv = append(kv, keyHandler.String(k.handler), keyEvent.String(k.kind.String()))
	kv = appendCommon(kv, k)
	return attribute.NewSet(kv...)
}

func attemptSet(k setKey) attribute.Set {
	kv := make([]attribute.KeyValue, 0, 9)
	kv = append(kv, keyHandler.String(k.handler), keyAttempt.Int(k.attempt), keyOutcome.String(outcome(k, false)))
	kv = appendCommon(kv, k)
	return attribute.NewSet(kv...)
}

func callSet(k setKey) attribute.Set {
	kv := make([]attribute.KeyValue, 0, 8)
	kv = append(kv, keyHandler.String(k.handler), keyOutcome.String(outcome(k, true)))
	kv = appendCommon(kv, k)
	return attribute.NewSet(kv...)
}

func stateSet(k setKey) attribute.Set {
	kv := make([]attribute.KeyValue, 0, 4)
	kv = append(kv, keyHandler.String(k.handler))
	kv = appendHost(kv, k.host)
	return attribute.NewSet(kv...)
}

func appendCommon(kv []attribute.KeyValue, k setKey) []attribute.KeyValue {
	if k.method != "" {
		kv = append(kv, keyMethod.String(k.method))
	}
	if k.status != 0 {
		kv = append(kv, keyStatus.Int(k.status))
	}
	if k.errType != "" {
		kv = append(kv, keyErrType.String(k.errType))
	}
	if k.endpoint != "" {
		kv = append(kv, keyEndpoint.String(k.endpoint))
	}
	return appendHost(kv, k.host)
}

// appendHost adds the attributes of an authority, scheme://host[:port].
func appendHost(kv []attribute.KeyValue, authority string) []attribute.KeyValue {
	if authority == "" {
		return kv
	}
	scheme, hostport, ok := strings.Cut(authority, "://")
	if !ok {
		return append(kv, keyAddress.String(authority))
	}
	host, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	kv = append(kv, keyAddress.String(host))
	if n, err := strconv.Atoi(port); err == nil {
		kv = append(kv, keyPort.Int(n))
	}
	return append(kv, keyScheme.String(scheme))
}

// method returns m if it is a standard method, "_OTHER" otherwise.
func method(m string) string {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		return m
	}
	return "_OTHER"
}

// outcome classifies an attempt or a call from its status and error type.
func outcome(k setKey, call bool) string {
	switch k.errType {
	case "":
		if k.status != 0 && !resilience.IsTransient(&http.Response{StatusCode: k.status}, nil) {
			return outcomeSuccess
		}
		return outcomeFailure
	case errAttemptTimeout, errTotalTimeout, errDeadlineExceeded, errTimeout:
		return outcomeTimeout
	case errCanceled:
		return outcomeCanceled
	case errCircuitOpen, errRateLimited, errOverloaded:
		if call {
			return outcomeRejected
		}
	}
	return outcomeFailure
}

// circuitReason is the error type of the reason a circuit is open.
func circuitReason(err error) string {
	if errors.Is(err, resilience.ErrIsolated) {
		return errIsolated
	}
	return ""
}

// errorType returns the bounded name of err described in the package doc.
func errorType(err error) string {
	if s := knownErrorType(err); s != "" {
		return s
	}
	if timeout(err) {
		return errTimeout
	}
	return reflect.TypeOf(cause(err)).String()
}

// knownErrorType returns the name of err's class when it is one of the
// handler's errors or the context's, and "" otherwise.
func knownErrorType(err error) string {
	switch {
	case errors.Is(err, resilience.ErrCircuitOpen):
		return errCircuitOpen
	case errors.Is(err, resilience.ErrRateLimited):
		return errRateLimited
	case errors.Is(err, resilience.ErrOverloaded):
		return errOverloaded
	case errors.Is(err, resilience.ErrBudgetExhausted):
		return errBudgetExhausted
	case errors.Is(err, resilience.ErrTotalTimeout):
		return errTotalTimeout
	case errors.Is(err, resilience.ErrAttemptTimeout):
		return errAttemptTimeout
	}
	return callerReason(err)
}

// callerReason returns errCanceled or errDeadlineExceeded when err is, or
// wraps, the context's own error, compared as a value, and "" otherwise.
// errors.Is would also say DeadlineExceeded of a transport's own timeouts
// (net/http's, a dial's), which are "timeout" here as in the root
// package's ErrorType: a caller's deadline and an upstream's slowness are
// two classes.
func callerReason(err error) string {
	for err != nil {
		switch err {
		case context.Canceled:
			return errCanceled
		case context.DeadlineExceeded:
			return errDeadlineExceeded
		}
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if s := callerReason(e); s != "" {
					return s
				}
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}

// timeout reports whether an error in err's tree has a Timeout method that
// reports true. Unlike errors.As with an interface target, it allocates
// nothing for a chain of single wrappers.
func timeout(err error) bool {
	for err != nil {
		if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
			return true
		}
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if timeout(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// rootPkg is the import path of the package whose call errors wrap causes.
var rootPkg = reflect.TypeFor[resilience.Handler]().PkgPath()

// cause strips the wrappers of err that say nothing of its type: net/http's
// *url.Error and the error a resilience Transport returns, whose last
// wrapped error is the cause.
func cause(err error) error {
	for {
		switch x := err.(type) {
		case *url.Error:
			if x.Err == nil {
				return err
			}
			err = x.Err
			continue
		case interface{ Unwrap() []error }:
			t := reflect.TypeOf(err)
			if t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
			if t.PkgPath() != rootPkg {
				return err
			}
			errs := x.Unwrap()
			if len(errs) == 0 || errs[len(errs)-1] == nil {
				return err
			}
			err = errs[len(errs)-1]
			continue
		}
		return err
	}
}
