package resilience

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/resilienthttp/resilience/internal/httpbody"
)

// A deliveredBody is the body of the response handed to the caller: the
// call itself, whose end the body's end is. One pointer, so that making it
// the response's Body allocates nothing.
type deliveredBody struct{ *call }

// errDrainTimeout cuts short the draining of a retried response.
var errDrainTimeout = errors.New("resilience: drain timeout")

// discard drains and closes a response that is retried, bounded in bytes
// and time, and releases its attempt. It returns a copy of resp holding
// what was read when that was the whole body (nil otherwise): the answer to
// give the caller if the retry is not made after all.
func (c *call) discard(resp *http.Response) *http.Response {
	c.mu.Lock()
	now := time.Now()
	at, why := now.Add(httpbody.MaxDrainTime), drainCause
	if !c.totalAt.IsZero() && c.totalAt.Before(at) {
		at, why = c.totalAt, totalCause
	}
	c.armLocked(at, why, now)
	c.mu.Unlock()
	kept := httpbody.DrainKeeping(resp)
	c.mu.Lock()
	c.armLocked(time.Time{}, noCause, now)
	cancel := c.cancel
	c.cancel = nil
	c.mu.Unlock()
	if cancel != nil { // nil for a response already kept in memory
		cancel(nil)
	}
	return kept
}

// deliver hands resp to the caller, its body wrapped so that the end of the
// body ends the call.
func (c *call) deliver(resp *http.Response) {
	resp.Request = c.req
	switch {
	case resp.Body == nil || resp.Body == http.NoBody:
		if c.cfg.Fallback.Enabled {
			c.keepEmpty(resp)
		}
		c.finish()
	case resp.StatusCode == http.StatusSwitchingProtocols:
		// The body is the upgraded connection: no deadline applies to it
		// and no permit is held for it, but its context lives until Close.
		c.mu.Lock()
		c.releaseTimerLocked()
		c.mu.Unlock()
		c.releasePermit()
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = upgraded{rwc, c}
		}
	default:
		c.rc = resp.Body
		if c.cfg.Fallback.Enabled {
			c.rc = c.keeping(resp)
		}
		if _, ok := c.rc.(io.WriterTo); ok {
			resp.Body = deliveredWriterTo{deliveredBody{c}}
		} else {
			resp.Body = deliveredBody{c}
		}
		c.mu.Lock()
		c.delivered = true
		late := c.fired == totalCause
		c.mu.Unlock()
		if late { // the total timeout fired between the headers and now
			c.expire()
		}
	}
}

// expire ends a call whose body the caller holds when the total timeout
// fires, whatever the caller does with the body: its permit goes back, as
// http.Client gives back what a call holds when its Timeout fires, and a
// body never read nor closed cannot keep it for ever. The body then fails
// with ErrTotalTimeout; closing it is still the caller's to do.
func (c *call) expire() {
	if first := !c.set(deliveryReported) && !c.is(deliveryDone); first {
		c.emit(Event{Kind: EventTotalTimeout, Err: ErrTotalTimeout})
	}
	c.finish()
}

// Read reads the response body, ending the call at EOF or on an error.
// Past the end it says io.EOF again, as net/http's own body does, until
// the caller closes it; rc, closed at the end, would say it is closed.
func (c deliveredBody) Read(p []byte) (int, error) {
	if c.pastEnd() {
		return 0, io.EOF
	}
	n, err := c.rc.Read(p)
	if err != nil {
		end := uint32(deliveryEOF)
		if err != io.EOF {
			err, end = c.bodyError(err), 0
		}
		// Close before finish releases the attempt's context: an HTTP/2
		// body closed after its context is done leaves its stream, and so
		// its connection, busy for good.
		c.closeBody(end)
		c.finish()
	}
	return n, err
}

// deliveredWriterTo is a deliveredBody over a body that is an io.WriterTo,
// as an in-memory one is: io.Copy then takes the body's own way out rather
// than a buffer of its own (bench's in-memory base: one Read call and the
// 8 KiB buffer's pool saved per call).
type deliveredWriterTo struct{ deliveredBody }

// WriteTo writes the body to w, and ends the call: the body is read to its
// end, or it or w failed. Past the end it writes nothing, as Read says
// io.EOF there.
func (c deliveredWriterTo) WriteTo(w io.Writer) (int64, error) {
	if c.pastEnd() {
		return 0, nil
	}
	n, err := c.rc.(io.WriterTo).WriteTo(w)
	end := uint32(deliveryEOF)
	if err != nil {
		err, end = c.bodyError(err), 0
	}
	c.closeBody(end)
	c.finish()
	return n, err
}

// Close closes the response body and ends the call.
func (c deliveredBody) Close() error {
	err := c.closeBody(deliveryCallerClosed)
	c.finish()
	return err
}

// pastEnd reports whether the caller read the body to its end and has not
// closed it since.
func (c deliveredBody) pastEnd() bool {
	f := c.flags.Load()
	return f&deliveryEOF != 0 && f&deliveryCallerClosed == 0
}

// closeBody closes the returned response's body once, and sets the flags
// also (deliveryEOF, deliveryCallerClosed) in the same atomic operation:
// one fewer on the success path, which reads the body to its end and then
// closes it.
func (c deliveredBody) closeBody(also uint32) error {
	if c.flags.Or(deliveryClosed|also)&deliveryClosed != 0 {
		return nil
	}
	return c.rc.Close()
}

func (c deliveredBody) bodyError(err error) error {
	c.mu.Lock()
	fired := c.fired
	c.mu.Unlock()
	if fired != totalCause {
		return err
	}
	if first := !c.set(deliveryReported); first {
		c.emit(Event{Kind: EventTotalTimeout, Err: ErrTotalTimeout})
	}
	if errors.Is(err, ErrTotalTimeout) {
		err = nil
	}
	return c.errorf(ErrTotalTimeout, err, "of %v reading the response body", c.totalLimit)
}

// finish ends the call: the timer stops, the attempt's context is released
// and so is the concurrency permit. It is safe to call more than once.
func (c *call) finish() {
	if c.is(deliveryDone) || c.set(deliveryDone) {
		return // a load first: the caller's Close after the end finds it done, without an atomic write
	}
	c.mu.Lock()
	c.releaseTimerLocked()
	cancel := c.cancel
	c.cancel = nil
	c.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	c.releasePermit()
	if c.s != c.h.shared {
		c.h.hosts.release(c.s) // a call that began with Handler.stateFor
	}
}

// upgraded is the body of a 101 Switching Protocols response: the
// connection itself, writable.
type upgraded struct {
	io.ReadWriteCloser
	c *call
}

func (u upgraded) Close() error {
	err := u.ReadWriteCloser.Close()
	u.c.finish()
	return err
}
