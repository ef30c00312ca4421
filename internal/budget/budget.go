// Package budget is the retry budget of the resilience handler: a bucket
// of tokens shared by every call of a handler that follows whether retries
// work, not how often anything fails. A hedge that
// follows a handled failure is a retry; a hedge sent while an attempt still
// runs (speculative) is not: Hedging.MaxExtraLoad bounds those, and the
// budget neither counts nor refuses them, so that hedges that succeed
// never exhaust it.
//
//   - a retry that fails takes a token;
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
//
// The budget is exhausted from the first retry it refuses, and recovered
// once at least half of MaxTokens (and at least one token) is left
// unclaimed again; OnChange hears of each change once. Recovery waits for
// half the bucket, not for the first retry allowed, so that a bucket that
// hovers near empty (first attempts that succeed refilling it a fifth of a
// token at a time, the retries they allow failing) is one exhaustion, not
// an exhaustion and a recovery every few calls.
package budget

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// ErrExhausted is what a Refusal is, for errors.Is. The root package
// exports it as ErrBudgetExhausted.
var ErrExhausted = errors.New("resilience: retry budget exhausted")

// A Budget is a retry budget. New makes one.
type Budget struct {
	max, ratio, reward atomic.Int64 // thousandths of a token
	tokens             atomic.Int64
	inflight           atomic.Int64 // retries sent whose outcome is not recorded yet
	exhausted          atomic.Bool  // a retry was refused, and the budget has not recovered since

	// OnChange, when set (before the budget is used), is called once when
	// the budget becomes exhausted, with why (a *Refusal), and once when it
	// recovers, with nil. It is called synchronously by the goroutine that
	// made the change, holding no lock; two changes made at nearly the same
	// moment by two goroutines may be heard out of order.
	OnChange func(exhausted bool, why error)
}

// New returns a full budget of maxTokens tokens that puts back ratio of
// a token for each first attempt that succeeds and reward tokens for each
// retry that succeeds.
func New(maxTokens, ratio, reward float64) *Budget {
	b := &Budget{}
	b.Set(maxTokens, ratio, reward)
	b.tokens.Store(b.max.Load())
	return b
}

// Set changes the budget's parameters, keeping its tokens (at most the new
// maximum) and its claims.
func (b *Budget) Set(maxTokens, ratio, reward float64) {
	b.max.Store(int64(math.Round(maxTokens * 1000)))
	b.ratio.Store(int64(math.Round(ratio * 1000)))
	b.reward.Store(int64(math.Round(reward * 1000)))
	b.add(0) // within the new maximum
	b.recovered()
}

// Refuses returns why a retry may not be made now, or nil if it may: a
// token is left that no retry in flight has claimed. The reason is the
// budget as it stood when it decided. A nil budget (none)
// refuses nothing.
func (b *Budget) Refuses() *Refusal {
	if b == nil {
		return nil
	}
	t, n := b.tokens.Load(), b.inflight.Load()
	if t-1000*n >= 1000 {
		return nil
	}
	return b.refused(t, n)
}

// Take claims an unclaimed token for a retry about to be sent, and returns
// nil; or, when there was none, why, as the budget stood when it decided.
// The retry's outcome, recorded, or its release settles the claim. A nil
// budget (none) claims nothing and refuses nothing.
func (b *Budget) Take() *Refusal {
	if b == nil {
		return nil
	}
	for {
		n := b.inflight.Load()
		t := b.tokens.Load()
		if t-1000*(n+1) < 0 {
			return b.refused(t, n)
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return nil
		}
	}
}

// ClaimAnyway claims a token whether or not one is left, for a retry that
// must be made: the call has no other answer to give.
func (b *Budget) ClaimAnyway() { b.inflight.Add(1) }

// Release settles the claim of a retry whose outcome says nothing of the
// upstream: it was not sent after all, or was abandoned.
func (b *Budget) Release() {
	b.inflight.Add(-1)
	b.recovered()
}

// refused returns the refusal of a budget of t thousandths of a token with
// n retries in flight, and reports the budget exhausted if it was not.
func (b *Budget) refused(t, n int64) *Refusal {
	if !b.exhausted.Load() && b.exhausted.CompareAndSwap(false, true) && b.OnChange != nil {
		b.OnChange(true, &Refusal{tokens: t, inflight: n})
	}
	return &Refusal{tokens: t, inflight: n}
}

// recovered reports an exhausted budget recovered once at least half of
// its maximum, and at least one token, is unclaimed. It costs one atomic
// load while the budget is not exhausted.
func (b *Budget) recovered() {
	if !b.exhausted.Load() {
		return
	}
	if b.tokens.Load()-1000*b.inflight.Load() < max(b.max.Load()/2, 1000) {
		return
	}
	if b.exhausted.CompareAndSwap(true, false) && b.OnChange != nil {
		b.OnChange(false, nil)
	}
}

// Record accounts for an attempt's outcome: the first attempt of its call
// or a later one (which settles its claim), failed (in a way the retry layer
// would retry) or not.
func (b *Budget) Record(first, failed bool) {
	if !first {
		b.inflight.Add(-1)
	}
	defer b.recovered()
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

// Pushback accounts for an attempt a server answered "do not retry" (the
// first of its call or a later one, which settles its claim): it costs a
// token, as a failed retry does, whichever attempt it answers, so that an
// upstream that pushes back drains the budget of every caller's retries.
func (b *Budget) Pushback(first bool) {
	if !first {
		b.inflight.Add(-1)
	}
	defer b.recovered()
	b.add(-1000)
}

// add moves the bucket by d thousandths, within [0, max]; free while the
// bucket is full and d puts back.
func (b *Budget) add(d int64) {
	for {
		t := b.tokens.Load()
		n := min(b.max.Load(), max(0, t+d))
		if n == t || b.tokens.CompareAndSwap(t, n) {
			return
		}
	}
}

// Level is how many tokens the bucket holds.
func (b *Budget) Level() float64 { return float64(b.tokens.Load()) / 1000 }

// InFlight is how many retries hold a claim: sent, and their outcome not
// recorded yet.
func (b *Budget) InFlight() int64 { return b.inflight.Load() }

// A Refusal says that the retry budget refused a retry, and why: the
// budget as it stood when it decided.
type Refusal struct {
	tokens   int64 // thousandths of a token
	inflight int64 // retries sent whose outcome was not recorded yet
	last     error // the outcome that was not retried, if an error
}

// Of returns e, the refusal to retry last (nil when not an error), as an
// error.
func (e *Refusal) Of(last error) error {
	e.last = last
	return e
}

// Error states the reason that is true of the budget when it refused: less
// than a token left, which only failed retries take away; or tokens left,
// every one claimed by a retry still in flight, whatever the outcomes.
func (e *Refusal) Error() string {
	level := float64(e.tokens/100) / 10 // rounded down: 0.95 tokens is not 1.0
	var msg string
	switch {
	case e.tokens >= 1000:
		msg = fmt.Sprintf("retry budget exhausted (%.1f tokens): every whole token is claimed by one of the %d retries in flight", level, e.inflight)
	case e.inflight > 0:
		msg = fmt.Sprintf("retry budget exhausted (%.1f tokens, %d retries in flight): recent retries failed", level, e.inflight)
	default:
		msg = fmt.Sprintf("retry budget exhausted (%.1f tokens): recent retries failed", level)
	}
	if e.last != nil {
		msg += "; not retried: " + e.last.Error()
	}
	return msg
}

func (e *Refusal) Unwrap() error { return e.last }

func (e *Refusal) Is(target error) bool { return target == ErrExhausted }
