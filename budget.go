package resilience

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// retryBudget is a bucket of tokens shared by every call of a handler that
// follows whether retries work, not how often anything fails:
//
//   - a retry (or hedge) that fails takes a token;
//   - a retry that succeeds puts back RetrySuccessTokens;
//   - a first attempt that succeeds puts back TokenRatio of a token;
//   - a first attempt that fails costs nothing;
//
// and a retry is made only while at least one token is left that no retry
// in flight has claimed: a retry claims a token when it is sent, and its
// outcome settles the claim. So however slowly retries fail (an upstream
// that hangs until the attempt timeout) and however many calls retry at
// once, at most MaxTokens retries are ever unaccounted for.
//
// Retries that succeed at least once in 1+RetrySuccessTokens keep the
// bucket full, so against an upstream that fails at random, however often,
// every retry the retry layer allows is made, a burst of simultaneous
// failures (one HTTP/2 connection dropping) included, and a sparse caller
// is never refused. Against an upstream that fails every attempt (down, or
// in an outage) the retries fail, the bucket empties after MaxTokens of
// them, and the load stays near one attempt per call; first attempts that
// succeed again fill it.
//
// The budget of issue 3 (gRPC's retry throttling: every retryable failure
// took a token, any other outcome put back 0.1, retries while over half
// full) followed the failure rate: it refused retries once more than about
// 9% of attempts failed, exactly where they help (measured in bench/,
// donoharm experiment).
//
// Tokens are kept in thousandths, in one atomic integer. The parameters are
// atomic too, so that Handler.Update can change them while calls run.
type retryBudget struct {
	max, ratio, reward atomic.Int64 // thousandths of a token
	tokens             atomic.Int64
	inflight           atomic.Int64 // retries sent whose outcome is not recorded yet
}

func newRetryBudget(maxTokens, ratio, reward float64) *retryBudget {
	b := &retryBudget{}
	b.set(maxTokens, ratio, reward)
	b.tokens.Store(b.max.Load())
	return b
}

// set changes the budget's parameters, keeping its tokens (at most the new
// maximum) and its claims.
func (b *retryBudget) set(maxTokens, ratio, reward float64) {
	b.max.Store(int64(math.Round(maxTokens * 1000)))
	b.ratio.Store(int64(math.Round(ratio * 1000)))
	b.reward.Store(int64(math.Round(reward * 1000)))
	b.add(0) // within the new maximum
}

// allow reports whether a retry or hedge may be made now: whether a token
// is left that no retry in flight has claimed.
func (b *retryBudget) allow() bool {
	return b.tokens.Load()-1000*b.inflight.Load() >= 1000
}

// claim takes an unclaimed token for a retry or hedge about to be sent, and
// reports whether there was one. The retry's outcome, recorded, or its
// release settles the claim.
func (b *retryBudget) claim() bool {
	for {
		n := b.inflight.Load()
		if b.tokens.Load()-1000*(n+1) < 0 {
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// claimAnyway claims a token whether or not one is left, for a retry that
// must be made: the call has no other answer to give.
func (b *retryBudget) claimAnyway() { b.inflight.Add(1) }

// release settles the claim of a retry whose outcome says nothing of the
// upstream: it was not sent after all, or was abandoned.
func (b *retryBudget) release() { b.inflight.Add(-1) }

// record accounts for an attempt's outcome: the first attempt of its call
// or a later one (which settles its claim), failed (in a way the retry layer
// would retry) or not.
func (b *retryBudget) record(first, failed bool) {
	if !first {
		b.release()
	}
	switch {
	case first && !failed:
		b.add(b.ratio.Load())
	case first:
		// A first attempt's failure costs nothing: only retries spend.
	case failed:
		b.add(-1000)
	default:
		b.add(b.reward.Load())
	}
}

// add moves the bucket by d thousandths, within [0, max]; free while the
// bucket is full and d puts back.
func (b *retryBudget) add(d int64) {
	for {
		t := b.tokens.Load()
		n := min(b.max.Load(), max(0, t+d))
		if n == t || b.tokens.CompareAndSwap(t, n) {
			return
		}
	}
}

// level is how many tokens the bucket holds.
func (b *retryBudget) level() float64 { return float64(b.tokens.Load()) / 1000 }

// ErrBudgetExhausted is why the retry budget refused a retry or hedge: the
// Err of an EventBudgetExceeded is, for errors.Is, this error, and it wraps
// the outcome that was not retried, if an error. The caller gets that
// outcome, never this error.
var ErrBudgetExhausted = errors.New("resilience: retry budget exhausted")

// refusal is why the budget refused a retry: the Err of EventBudgetExceeded,
// wrapping the outcome that would have been retried.
func (b *retryBudget) refusal(last error) error {
	return &budgetError{level: b.level(), last: last}
}

// budgetError says that the retry budget refused a retry, and why.
type budgetError struct {
	level float64
	last  error // the outcome that was not retried, if an error
}

func (e *budgetError) Error() string {
	msg := fmt.Sprintf("retry budget exhausted (%.1f tokens): recent retries failed", e.level)
	if e.last != nil {
		msg += "; not retried: " + e.last.Error()
	}
	return msg
}

func (e *budgetError) Unwrap() error { return e.last }

func (e *budgetError) Is(target error) bool { return target == ErrBudgetExhausted }
