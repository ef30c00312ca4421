package resilience

//lint:file-ignore SA1019 Request.Cancel is deprecated, but http.Client still closes it for a RoundTripper it does not know, so the handler honours it (callerLeft)

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/resilienthttp/resilience/internal/headers"
	"github.com/resilienthttp/resilience/internal/httpcache"
)

// The fallback layer, outside the whole stack: a GET or HEAD whose call
// fails because the circuit is open (or, with OnTransient, because retries
// ran out on a transient failure, a 5xx response included, or the total
// timeout passed) is answered
// with the last good response kept for the same request, labelled and with
// its Age. Responses are kept as the caller reads them (keeping, below);
// the store is fallbackstore.go's.

// ErrFallbackRefused reports that no kept response could answer a failed
// call; it wraps the call's error and the reason, such as ErrFallbackNone.
var ErrFallbackRefused = errors.New("resilience: fallback refused")

// Why a fallback was refused; each is ErrFallbackRefused for errors.Is.
var (
	// ErrFallbackIneligible means the request may not get a kept response.
	ErrFallbackIneligible error = &fallbackReason{"ineligible"}
	// ErrFallbackNone means no response is kept for the request.
	ErrFallbackNone error = &fallbackReason{"none kept"}
	// ErrFallbackTooStale means the kept response is too old to serve.
	ErrFallbackTooStale error = &fallbackReason{"too stale"}
)

type fallbackReason struct{ s string }

func (r *fallbackReason) Error() string        { return "resilience: fallback refused: " + r.s }
func (r *fallbackReason) Is(target error) bool { return target == ErrFallbackRefused }

// fallbackRefusal is a call's error with the reason its fallback was
// refused.
type fallbackRefusal struct {
	err    error
	reason error
}

func (e *fallbackRefusal) Error() string {
	return e.err.Error() + " (fallback refused: " + e.reason.(*fallbackReason).s + ")"
}
func (e *fallbackRefusal) Unwrap() []error { return []error{e.err, e.reason} }

// Timeout and Temporary keep net.Error checks of the call's error working.
func (e *fallbackRefusal) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.err, &t) && t.Timeout()
}
func (e *fallbackRefusal) Temporary() bool { return e.Timeout() }

// store returns the store the call keeps responses in: its options' own,
// or its handler's.
func (c *call) store() FallbackStore {
	if s := c.cfg.Fallback.Store; s != nil {
		return s
	}
	return c.h.fbStore
}

// keeping returns the body to read resp through: a tee that keeps the
// response when it is read to EOF if the fallback layer may keep it
// (keeper), else resp.Body.
func (c *call) keeping(resp *http.Response) io.ReadCloser {
	if t := c.keeper(resp); t != nil {
		return t
	}
	return resp.Body
}

// keepEmpty keeps resp, which has no body (an empty 200 the transport gave
// http.NoBody), if the fallback layer may keep it: an empty answer is an
// answer, and replaces the one kept before.
func (c *call) keepEmpty(resp *http.Response) {
	if t := c.keeper(resp); t != nil {
		t.put()
	}
}

// keeper returns the keeper of resp if a shared cache could store it (a 200
// to a GET, without no-store, private, no-cache, must-revalidate,
// proxy-revalidate, Set-Cookie or Vary: *, and whose request carried no
// credentials unless ShareCredentialed), else nil.
func (c *call) keeper(resp *http.Response) *keeper {
	f := &c.cfg.Fallback
	if c.req.Method != http.MethodGet || resp.StatusCode != http.StatusOK || resp.ContentLength > f.MaxEntryBytes {
		return nil
	}
	key := httpcache.Key(c.req, c.cfg.Fallback.ShareCredentialed)
	if key == "" {
		return nil
	}
	// RFC 9111 4.2.4: no-cache, must-revalidate and proxy-revalidate forbid
	// serving the response stale.
	for _, d := range []string{"no-store", "private", "no-cache", "must-revalidate", "proxy-revalidate"} {
		if _, ok := httpcache.Directive(resp.Header, d); ok {
			return nil
		}
	}
	if headers.Has(resp.Header, "Set-Cookie") {
		return nil
	}
	vary, ok := httpcache.VaryNames(resp)
	if !ok {
		return nil
	}
	t := &keeper{rc: resp.Body, h: c.h, store: c.store(), key: key, vary: vary,
		req: c.req, max: f.MaxEntryBytes, status: resp.StatusCode, header: resp.Header.Clone()}
	if resp.ContentLength > 0 {
		t.buf = make([]byte, 0, resp.ContentLength)
	}
	return t
}

// keeper is a response body that keeps what the caller reads, and stores
// it when the caller reaches EOF.
type keeper struct {
	rc      io.ReadCloser
	h       *Handler
	store   FallbackStore
	key     string
	vary    []string
	req     *http.Request
	max     int64
	status  int
	header  http.Header
	buf     []byte
	dropped bool
}

func (t *keeper) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if !t.dropped {
		if int64(len(t.buf)+n) > t.max {
			t.dropped, t.buf = true, nil
		} else {
			t.buf = append(t.buf, p[:n]...)
		}
	}
	if err == io.EOF && !t.dropped {
		t.dropped = true // stored once
		t.put()
	} else if err != nil {
		t.dropped, t.buf = true, nil
	}
	return n, err
}

// Close closes the body. It leaves the buffer alone: a caller may close the
// body from another goroutine to cut a Read short, which then fails and
// drops what was kept.
func (t *keeper) Close() error { return t.rc.Close() }

func (t *keeper) put() {
	body := t.buf
	t.buf = nil
	if cap(body) != len(body) {
		// A body of unknown length grew by append, to up to about 1.25
		// times its length: keep it in a buffer of its size, so that what
		// the store counts is what it holds.
		body = append(make([]byte, 0, len(body)), body...)
	}
	if body == nil {
		body = []byte{}
	}
	e := &FallbackEntry{StatusCode: t.status, Header: t.header, Body: body, Stored: t.h.fbNow()}
	if len(t.vary) == 0 {
		t.store.Put(t.req.Context(), t.key, e)
		return
	}
	t.store.Put(t.req.Context(), t.key, &FallbackEntry{Vary: t.vary, Stored: e.Stored})
	t.store.Put(t.req.Context(), httpcache.VariantKey(t.key, t.req, t.vary), e)
}

// fallbackServes reports whether the call's error err is one the fallback
// layer answers.
func (c *call) fallbackServes(err error) bool {
	if c.callerLeft() != nil {
		return false // no one to answer
	}
	if errors.Is(err, ErrCircuitOpen) {
		return true
	}
	return c.cfg.Fallback.OnTransient && (errors.Is(err, ErrTotalTimeout) || transientError(err))
}

// fallback answers the call that failed with err from the kept response,
// or returns err with the reason it could not.
func (c *call) fallback(err error) (*http.Response, error) {
	if !c.fallbackServes(err) {
		return nil, err
	}
	resp, reason, left := c.stale()
	if left != nil {
		return nil, c.errorf(nil, left, "") // the caller left while the store looked: say so
	}
	if reason != nil {
		return nil, &fallbackRefusal{err, reason}
	}
	c.emit(Event{Kind: EventFallback, StatusCode: resp.StatusCode, Err: err})
	return resp, nil
}

// fallbackOnStatus answers, with OnTransient, a call whose retries ran out on
// a 500, 502, 503 or 504 (what RFC 5861's stale-if-error counts as an
// error) with the kept response instead, and the upstream's own response,
// untouched, when there is none to serve. A caller that left while the
// store looked gets its own error, and the upstream's response is
// discarded.
func (c *call) fallbackOnStatus(resp *http.Response) (*http.Response, error) {
	switch resp.StatusCode {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return resp, nil
	}
	if !c.cfg.Fallback.OnTransient || c.callerLeft() != nil {
		return resp, nil
	}
	kept, reason, left := c.stale()
	if left != nil {
		c.discard(resp)
		return nil, c.errorf(nil, left, "")
	}
	if reason != nil {
		return resp, nil
	}
	c.discard(resp) // the upstream's error answer gives way to the kept one
	c.emit(Event{Kind: EventFallback, StatusCode: kept.StatusCode})
	return kept, nil
}

// stale returns the response kept for the call's request, labelled and
// with its Age, or why there is none to serve: ErrFallbackIneligible,
// ErrFallbackNone or ErrFallbackTooStale; or, when the caller left while
// the store looked, the caller's error as left.
func (c *call) stale() (resp *http.Response, reason, left error) {
	key := httpcache.Key(c.req, c.cfg.Fallback.ShareCredentialed)
	if key == "" {
		return nil, ErrFallbackIneligible, nil
	}
	store := c.store()
	e, ok, left := c.storeGet(store, key)
	if left == nil && ok && e != nil && e.Vary != nil {
		e, ok, left = c.storeGet(store, httpcache.VariantKey(key, c.req, e.Vary))
	}
	if left != nil {
		return nil, nil, left
	}
	if !ok || e == nil || e.Vary != nil {
		return nil, ErrFallbackNone, nil
	}
	// The time since it was kept (a clock stepped back makes it fresh, not
	// negative) plus the Age it came with, both at most 2^31 s, and so is
	// their sum: no overflow, and never an Age above 2^31 served.
	const maxAge = httpcache.MaxDeltaSeconds * time.Second
	resident := min(max(0, c.h.fbNow().Sub(e.Stored)), maxAge)
	age := min(resident+httpcache.ReceivedAge(e.Header), maxAge)
	bound := c.cfg.Fallback.MaxStale
	if v, ok := httpcache.Directive(e.Header, "stale-if-error"); ok {
		if s, ok := httpcache.DeltaSeconds(v); ok {
			bound = time.Duration(s) * time.Second
		}
	}
	if age > bound {
		return nil, ErrFallbackTooStale, nil
	}
	h := headers.CanonicalClone(e.Header) // the label and Age replace any spelling of theirs
	h.Set(c.cfg.Fallback.Header, "stale")
	h.Set("Age", strconv.FormatInt(int64(age/time.Second), 10))
	resp = &http.Response{
		Status:        strconv.Itoa(e.StatusCode) + " " + http.StatusText(e.StatusCode),
		StatusCode:    e.StatusCode,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          http.NoBody,
		ContentLength: int64(len(e.Body)),
		Request:       c.req,
	}
	if c.req.Method == http.MethodGet && len(e.Body) > 0 {
		resp.Body = io.NopCloser(bytes.NewReader(e.Body))
	}
	return resp, nil, nil
}

// maxLateStoreGets bounds the Gets of a plugged-in store still running for
// callers that left: past it, a store that does not return on its context
// is not asked again until some return, so that it cannot pile up
// goroutines during an outage.
const maxLateStoreGets = 64

// storeGet returns the entry store keeps under key, or, when the caller
// leaves first, the caller's error as left: a caller that left is never
// answered, nor kept waiting for a store that does not honour its
// context. The built-in store never blocks, and is asked on the caller's
// goroutine; so is a plugged-in one when nothing can end the caller's
// wait. Otherwise the Get runs on a goroutine of its own, which the
// caller stops waiting for once it leaves.
func (c *call) storeGet(store FallbackStore, key string) (e *FallbackEntry, ok bool, left error) {
	ctx := c.req.Context()
	if _, builtIn := store.(*lruStore); builtIn || (ctx.Done() == nil && c.req.Cancel == nil) {
		e, ok = store.Get(ctx, key)
		return e, ok, c.callerLeft()
	}
	if c.h.fbLate.Load() >= maxLateStoreGets {
		return nil, false, c.callerLeft()
	}
	type got struct {
		e  *FallbackEntry
		ok bool
	}
	const (
		waiting  = iota
		returned // the store returned while the caller waited
		late     // the caller left first: the Get counts in fbLate until it returns
	)
	var state atomic.Int32
	answer := make(chan got, 1)
	go func() {
		e, ok := store.Get(ctx, key)
		answer <- got{e, ok}
		if !state.CompareAndSwap(waiting, returned) {
			c.h.fbLate.Add(-1)
		}
	}()
	var why error
	select {
	case g := <-answer:
		return g.e, g.ok, c.callerLeft()
	case <-ctx.Done():
		why = ctx.Err()
	case <-c.req.Cancel: // nil, and so never ready, unless the caller set it
		why = errRequestCanceled
	}
	c.h.fbLate.Add(1)
	if !state.CompareAndSwap(waiting, late) {
		c.h.fbLate.Add(-1) // it returned meanwhile
	}
	return nil, false, why
}
