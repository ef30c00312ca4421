package resilience

import (
	"math"
	"sync/atomic"
)

// retryBudget is retry throttling in the style of gRPC's (proposal A6): a
// bucket of tokens shared by every call of a handler. Each attempt that
// fails in a way the retry layer would retry takes one token; each other
// outcome puts back TokenRatio of one; retries and hedges are made only
// while the bucket holds more than half of MaxTokens.
//
// It depends on the failure rate of attempts, not on how many are in
// flight: below a failure rate of TokenRatio/(1+TokenRatio) (about 9% by
// default) the bucket stays full and every retry is made, whatever the
// traffic; against an upstream that fails every call, the bucket empties in
// a few attempts and the load stays near one attempt per call, however fast
// the failures come. A concurrency budget cannot do both: counting only
// attempts on the wire it sees no retries in flight when failures are fast,
// and counting retries through their waits it refuses them at light
// traffic and low failure rates (measured in bench/).
//
// Tokens are kept in thousandths, in one atomic integer.
type retryBudget struct {
	max, ratio int64 // thousandths of a token
	tokens     atomic.Int64
}

func newRetryBudget(maxTokens, ratio float64) *retryBudget {
	b := &retryBudget{max: int64(math.Round(maxTokens * 1000)), ratio: int64(math.Round(ratio * 1000))}
	b.tokens.Store(b.max)
	return b
}

// allow reports whether a retry or hedge may be made now.
func (b *retryBudget) allow() bool { return b.tokens.Load() > b.max/2 }

// succeeded puts back a share of a token; free while the bucket is full.
func (b *retryBudget) succeeded() {
	for {
		t := b.tokens.Load()
		if t >= b.max {
			return
		}
		if b.tokens.CompareAndSwap(t, min(b.max, t+b.ratio)) {
			return
		}
	}
}

// failed takes a token, if any is left.
func (b *retryBudget) failed() {
	for {
		t := b.tokens.Load()
		if t <= 0 {
			return
		}
		if b.tokens.CompareAndSwap(t, max(0, t-1000)) {
			return
		}
	}
}

// level is how many tokens the bucket holds.
func (b *retryBudget) level() float64 { return float64(b.tokens.Load()) / 1000 }
