package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// ReplayedHeader marks a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// A Middleware runs each keyed request with an unsafe method at most once
// and replays its response to retries. Create it with New; it is safe for
// concurrent use.
type Middleware struct {
	store Store
	opts  Options
	// nextSweep is when the next sweep is due, in unix nanoseconds: zero
	// at first (the first completed write sweeps), math.MaxInt64 while one
	// runs.
	nextSweep atomic.Int64
	// sweepBatch is the batch the next sweep starts with: SweepBatch, or
	// more after a sweep that stopped behind.
	sweepBatch atomic.Int64
}

// New returns a Middleware that keeps its keys in store.
func New(store Store, opts Options) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: nil Store")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Middleware{store: store, opts: o}, nil
}

// Handler returns next behind the protocol. Requests with a safe method
// (GET, HEAD, OPTIONS, TRACE) go to next untouched, as do requests without a
// key unless Options.RequireKey is set.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// storeTimeout bounds each store operation of an owner (its commit, its
// abort) and each sweep, from when that operation starts: the handler may
// run as long as it needs, and the work done is worth recording even if
// its caller went away, so these run without the request's cancellation.
const storeTimeout = 10 * time.Second

// storeContext returns the context of one store operation that starts now:
// the request's values, not its cancellation, and a deadline of its own.
func storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		next.ServeHTTP(w, r)
		return
	}
	raw, present := headerValues(r.Header, m.opts.Header)
	if !present {
		if m.opts.RequireKey {
			fail(w, http.StatusBadRequest, 0, fmt.Sprintf("idempotency: header %s required for %s", m.opts.Header, r.Method))
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	if len(raw) != 1 {
		fail(w, http.StatusBadRequest, 0, fmt.Sprintf("idempotency: header %s given %d times; want once", m.opts.Header, len(raw)))
		return
	}
	key, err := parseKey(raw[0], m.opts.MaxKeyLength)
	if err != nil {
		fail(w, http.StatusBadRequest, 0, fmt.Sprintf("idempotency: invalid %s: %v", m.opts.Header, err))
		return
	}

	// Authorization before any lookup: a refused caller learns nothing
	// about the key.
	principal, err := m.opts.Principal(r)
	if err != nil {
		code := http.StatusUnauthorized
		if errors.Is(err, ErrForbidden) {
			code = http.StatusForbidden
		}
		fail(w, code, 0, http.StatusText(code))
		return
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	route := r.URL.Path
	if m.opts.Route != nil {
		route = m.opts.Route(r)
	}
	req := ClaimRequest{
		Key:    Key{Principal: principal, Operation: r.Method + " " + route, Key: key},
		Digest: digest(r, m.opts.DigestHeaders, body),
		Lease:  m.opts.Lease,
		TTL:    m.opts.TTL,
	}
	claimed := time.Now()
	claim, err := m.store.Claim(r.Context(), req)
	if err != nil {
		if claim.Txn != nil {
			// The claim was recorded, and its transaction could not begin
			// (the database went away in between): release it now, or as
			// soon as the database answers again, as after a failed commit.
			m.abort(r.Context(), owner{txn: claim.Txn, leaseEnd: claimed.Add(m.opts.Lease)})
		}
		if r.Context().Err() != nil {
			return // the caller went away
		}
		m.opts.Logger.ErrorContext(r.Context(), "idempotency: claim failed", "operation", bounded(req.Key.Operation), "err", err)
		fail(w, http.StatusServiceUnavailable, time.Second, "idempotency: store unavailable")
		return
	}
	if claim.State != Owned && claim.Digest != req.Digest {
		fail(w, http.StatusUnprocessableEntity, 0, "idempotency: this key was used with a different request")
		return
	}
	switch claim.State {
	case InProgress:
		fail(w, http.StatusConflict, m.retryAfter(claim.LeaseLeft), "idempotency: a request with this key is in progress")
	case Completed:
		write(w, claim.Response, true)
	case Owned:
		m.own(w, r, body, owner{txn: claim.Txn, leaseEnd: claimed.Add(m.opts.Lease)}, next)
		m.maybeSweep(r.Context(), w)
	default:
		m.opts.Logger.ErrorContext(r.Context(), "idempotency: store returned an unknown claim state", "state", int(claim.State))
		fail(w, http.StatusInternalServerError, 0, "idempotency: store error")
	}
}

// own runs next as the key's owner, inside txn, and commits its response
// with its effect, or rolls both back and releases the key. Each store
// operation gets its own deadline (storeContext), from when it starts: a
// handler slower than storeTimeout must not leave its commit or abort an
// expired context, and so its key claimed until the lease runs out.
func (m *Middleware) own(w http.ResponseWriter, r *http.Request, body []byte, o owner, next http.Handler) {
	txn := o.txn
	done := false
	defer func() {
		if !done { // next panicked: nothing recorded, key released
			m.abort(r.Context(), o)
		}
	}()
	rec := newRecorder(m.opts.MaxResponseBytes)
	r2 := r.WithContext(txn.Context(r.Context()))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	next.ServeHTTP(rec, r2)
	done = true

	resp := rec.response()
	switch {
	case rec.overflow:
		m.abort(r.Context(), o)
		fail(w, http.StatusInternalServerError, 0, fmt.Sprintf("idempotency: response body over the limit of %d bytes that can be recorded; rolled back", m.opts.MaxResponseBytes))
		return
	case resp.Status >= 500:
		m.abort(r.Context(), o) // a failure is not an outcome: a retry runs again
		write(w, resp, false)
		return
	}
	stored := &Response{Status: resp.Status, Header: replayHeader(resp.Header, m.opts.ReplayHeaders), Body: resp.Body}
	ctx, cancel := storeContext(r.Context())
	err := txn.Commit(ctx, stored)
	cancel()
	if err != nil {
		if errors.Is(err, ErrClaimLost) {
			fail(w, http.StatusConflict, time.Second, "idempotency: the lease of this request expired and a retry took it over")
			return
		}
		// The outcome is unknown: a commit can fail after it took effect.
		// Releasing the claim is safe either way, as the store deletes only
		// a claim this owner still holds (not a completed key), and lets a
		// retry run at once, or replay, instead of waiting out the lease.
		m.opts.Logger.ErrorContext(r.Context(), "idempotency: commit failed", "err", err)
		retryAfter := m.retryAfter(m.opts.Lease)
		if m.abort(r.Context(), o) {
			retryAfter = time.Second
		}
		fail(w, http.StatusServiceUnavailable, retryAfter, "idempotency: could not record the response")
		return
	}
	write(w, resp, false)
}

// An owner is the claim of a request that runs its handler: its
// transaction, and when its lease ends (measured from just before the
// claim, so no later than the store's).
type owner struct {
	txn      Txn
	leaseEnd time.Time
}

// abort rolls the owner's transaction back and releases its claim, with a
// deadline of its own, and reports whether it did. If it could not (the
// database is down, say), the owner keeps trying in the background, until
// the release lands or the lease ends (releaseLater): a live owner that
// knows it did not commit frees its key as soon as the database answers,
// and a retry need not wait out the lease, which is for owners that died.
func (m *Middleware) abort(ctx context.Context, o owner) bool {
	sctx, cancel := storeContext(ctx)
	err := o.txn.Abort(sctx)
	cancel()
	if err == nil {
		return true
	}
	m.opts.Logger.ErrorContext(ctx, "idempotency: abort failed; releasing the claim again until the store answers or the lease ends", "lease_left", time.Until(o.leaseEnd).Round(time.Millisecond), "err", err)
	go m.releaseLater(context.WithoutCancel(ctx), o)
	return false
}

// releaseRetry bounds the wait between two tries of releaseLater: the key
// is free within about this long of the database's return.
const releaseRetry = 500 * time.Millisecond

// releaseLater tries the owner's Abort again, after 50 ms and then twice
// as long each time up to releaseRetry, until it succeeds or the lease
// ends: past its end the key is free to a retry anyway. Safe whatever the
// commit did: a store releases only a claim that this owner still holds,
// never a key a commit completed or a retry took over (Txn.Abort).
func (m *Middleware) releaseLater(ctx context.Context, o owner) {
	wait := 50 * time.Millisecond
	for tries := 2; ; tries++ {
		left := time.Until(o.leaseEnd)
		if left <= wait {
			m.opts.Logger.ErrorContext(ctx, "idempotency: could not release the claim before its lease ended; the key is free again now", "tries", tries-1)
			return
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done(): // never: ctx is the request's without its cancellation
			timer.Stop()
			return
		}
		wait = min(2*wait, releaseRetry)
		actx, cancel := context.WithTimeout(ctx, min(storeTimeout, time.Until(o.leaseEnd)))
		err := o.txn.Abort(actx)
		cancel()
		if err == nil {
			m.opts.Logger.InfoContext(ctx, "idempotency: claim released once the store answered again", "tries", tries)
			return
		}
	}
}

// readBody reads the body in full, up to MaxBodyBytes; over it, it answers
// 413 and returns false.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	max := m.opts.MaxBodyBytes
	tooLarge := fmt.Sprintf("idempotency: request body over the limit of %d bytes", max)
	if r.ContentLength > max {
		fail(w, http.StatusRequestEntityTooLarge, 0, tooLarge)
		return nil, false
	}
	if r.Body == nil {
		return nil, true
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		fail(w, http.StatusBadRequest, 0, "idempotency: reading the request body failed")
		return nil, false
	}
	if int64(len(body)) > max {
		fail(w, http.StatusRequestEntityTooLarge, 0, tooLarge)
		return nil, false
	}
	return body, true
}

// retryAfter is the Retry-After of a 409: the rest of the lease, at least
// 1s, at most Options.RetryAfter.
func (m *Middleware) retryAfter(left time.Duration) time.Duration {
	return max(time.Second, min(left, m.opts.RetryAfter))
}

// maxLogged bounds what a log line keeps of a value the caller chose (the
// route, and so the operation): its first maxLogged bytes, and its length.
const maxLogged = 128

// bounded returns s, or its first maxLogged bytes (cut at a character's
// start) and how long it was, for a log line.
func bounded(s string) string {
	if len(s) <= maxLogged {
		return s
	}
	cut := maxLogged
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// headerValues returns the values of the header name (canonical) in h
// under any spelling of its name, and whether it is present: field names
// are case-insensitive, and a request built by hand or by a proxy may carry
// a map key that is not canonical ("idempotency-key"). The canonical
// spelling's values come first, then the others' in the order of their
// names, so that the result does not depend on map order.
func headerValues(h http.Header, name string) (vs []string, present bool) {
	vs, present = h[name]
	var others []string
	for k := range h {
		if k != name && strings.EqualFold(k, name) {
			others = append(others, k)
		}
	}
	slices.Sort(others)
	for _, k := range others {
		vs, present = append(slices.Clip(vs), h[k]...), true
	}
	return vs, present
}

// write sends resp; replayed marks it as a replay.
func write(w http.ResponseWriter, resp *Response, replayed bool) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	if replayed {
		h.Set(ReplayedHeader, "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// fail answers code with a plain-text message and, when retryAfter is set,
// a Retry-After in whole seconds (rounded up).
func fail(w http.ResponseWriter, code int, retryAfter time.Duration, msg string) {
	if retryAfter > 0 {
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	http.Error(w, msg, code)
}
