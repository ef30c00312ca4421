package redislimit

import (
	"context"
	"fmt"
	"time"
)

// maxInFlight bounds the Redis calls of one Limiter still running. A call
// that outlives Options.Timeout keeps its slot until go-redis gives up on
// it by its own timeouts (or the client is closed), so a stalled Redis
// holds at most this many goroutines and connections; once they are all
// taken, a new call waits for a slot within its Timeout, and counts as
// Redis being slow if none frees.
const maxInFlight = 16

// A redisCall is one Redis call run on a goroutine of its own, so that
// whoever waits for it stops at Options.Timeout whatever the client does.
//
// go-redis ignores a context's deadline unless its client was built with
// ContextTimeoutEnabled; it then waits for its own ReadTimeout (3s by
// default), retries and dials (5s), so the client that
// docs/shared-rate-limit.md shows held a call for seconds against a stalled
// Redis. The Limiter does not refuse such
// a client: the call still gets a context that ends at the Timeout (which
// a client with ContextTimeoutEnabled honours, ending the goroutine then),
// and its waiters stop waiting at the Timeout in any case.
type redisCall struct {
	done     chan struct{} // closed when fn has returned
	deadline time.Time     // when waiters stop waiting
	timeout  time.Duration
	err      error // fn's error, written before done is closed
}

// start runs fn on a goroutine of its own with a context that ends after
// Options.Timeout, once a slot of maxInFlight is free.
func (l *Limiter) start(fn func(ctx context.Context) error) *redisCall {
	c := l.newCall()
	l.do(c, fn, nil)
	return c
}

// newCall is a call not started yet: its Timeout runs from now.
func (l *Limiter) newCall() *redisCall {
	return &redisCall{done: make(chan struct{}), deadline: time.Now().Add(l.opts.Timeout), timeout: l.opts.Timeout}
}

// do makes the call c: fn, then then (when not nil) with fn's error, on
// a goroutine of its own once a slot of maxInFlight is free. If none
// frees before c's deadline, fn is not called, and then gets an error
// that wraps context.DeadlineExceeded. c is done after then.
func (l *Limiter) do(c *redisCall, fn func(ctx context.Context) error, then func(error)) {
	finish := func(err error) {
		if then != nil {
			then(err)
		}
		c.err = err
		close(c.done)
	}
	select {
	case l.slots <- struct{}{}:
	default:
		t := time.NewTimer(time.Until(c.deadline))
		select {
		case l.slots <- struct{}{}:
			t.Stop()
		case <-t.C:
			finish(fmt.Errorf("redislimit: %d Redis calls still running after their Timeout of %v: %w", maxInFlight, c.timeout, context.DeadlineExceeded))
			return
		}
	}
	go func() {
		defer func() { <-l.slots }()
		ctx, cancel := context.WithDeadline(context.Background(), c.deadline)
		defer cancel()
		finish(fn(ctx))
	}()
}

// wait returns the call's error once it has returned, or an error
// wrapping context.DeadlineExceeded once its Timeout has passed, or ctx's
// error if ctx ends first.
func (c *redisCall) wait(ctx context.Context) error {
	select {
	case <-c.done:
		return c.err
	default:
	}
	t := time.NewTimer(time.Until(c.deadline))
	defer t.Stop()
	select {
	case <-c.done:
		return c.err
	case <-t.C:
		select {
		case <-c.done:
			return c.err
		default:
		}
		return c.late()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// late is the error of a call that did not return within its Timeout.
func (c *redisCall) late() error {
	return fmt.Errorf("redislimit: Redis did not answer within Timeout %v: %w", c.timeout, context.DeadlineExceeded)
}
