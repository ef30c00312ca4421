package idempotency

import (
	"context"
	"math"
	"net/http"
	"time"
)

// A SweepReport says what one sweep of expired keys did, and what it left.
type SweepReport struct {
	// Deleted is how many expired keys the sweep deleted.
	Deleted int
	// Lag is how long the oldest expired key had been expired when the
	// sweep began (zero if none had): keys are kept for their TTL and then
	// about this long. Near SweepInterval when the sweep keeps up.
	Lag time.Duration
	// Kept is how many keys the store holds after the sweep (the live ones,
	// and any expired ones left): an exact count on SQLite, PostgreSQL's
	// estimate (its statistics, which follow writes within seconds) with
	// pgstore, -1 for a store that is not a KeyCounter or failed to count.
	Kept int
	// Behind reports that the sweep stopped with expired keys left, out of
	// time: the next completed write sweeps again at once.
	Behind bool
}

// maxBatchGrowth bounds how far a sweep that keeps finding full batches
// grows them: up to this many times SweepBatch a statement.
const maxBatchGrowth = 16

// sweepBudget bounds how long one automatic sweep deletes batches: it runs
// on a request's goroutine, and on SQLite each batch takes the one write
// lock. A sweep that runs out of it leaves the rest to the next write.
const sweepBudget = 250 * time.Millisecond

// Sweep deletes expired keys now, in batches of Options.SweepBatch, until
// none is left or ctx ends, for a program that sweeps on its own schedule
// (SweepInterval negative). Its report goes to Options.OnSweep too.
func (m *Middleware) Sweep(ctx context.Context) (SweepReport, error) {
	return m.sweep(ctx, 0)
}

// maybeSweep sweeps if a sweep is due; of concurrent requests, one does
// it, and none while it runs.
func (m *Middleware) maybeSweep(ctx context.Context, w http.ResponseWriter) {
	if m.opts.SweepInterval < 0 {
		return
	}
	next := m.nextSweep.Load()
	if time.Now().UnixNano() < next || !m.nextSweep.CompareAndSwap(next, math.MaxInt64) {
		return
	}
	due := time.Now().Add(m.opts.SweepInterval)
	defer func() { m.nextSweep.Store(due.UnixNano()) }()
	_ = http.NewResponseController(w).Flush() // the caller need not wait for the sweep
	ctx, cancel := storeContext(ctx)
	defer cancel()
	r, err := m.sweep(ctx, sweepBudget)
	if err == nil && r.Behind {
		due = time.Now() // more to delete: the next write sweeps again
	} else {
		due = time.Now().Add(m.opts.SweepInterval)
	}
}

// sweep deletes batches of expired keys until a batch comes back short,
// ctx ends, or (budget positive) budget has passed; then it counts the
// keys kept, reports, and logs.
func (m *Middleware) sweep(ctx context.Context, budget time.Duration) (SweepReport, error) {
	start := time.Now()
	r := SweepReport{Kept: -1}
	// The batch doubles while batches come back full, up to
	// maxBatchGrowth × SweepBatch, and stays grown while sweeps are behind:
	// a statement's own cost (a round trip, the write lock) must not cap
	// the rate at which a backlog goes.
	batch := int(max(m.sweepBatch.Load(), int64(m.opts.SweepBatch)))
	var err error
	for first := true; ; first = false {
		var (
			n   int
			lag time.Duration
		)
		n, lag, err = m.store.Sweep(ctx, batch)
		r.Deleted += n
		if first {
			r.Lag = lag
		}
		if err != nil || n < batch {
			break
		}
		batch = min(2*batch, maxBatchGrowth*m.opts.SweepBatch)
		if ctx.Err() != nil || (budget > 0 && time.Since(start) >= budget) {
			r.Behind = true
			break
		}
	}
	if r.Behind {
		m.sweepBatch.Store(int64(batch))
	} else {
		m.sweepBatch.Store(int64(m.opts.SweepBatch))
	}
	if err != nil {
		m.opts.Logger.ErrorContext(ctx, "idempotency: sweep failed", "deleted", r.Deleted, "err", err)
		return r, err
	}
	if c, ok := m.store.(KeyCounter); ok {
		if n, cerr := c.CountKeys(ctx); cerr == nil {
			r.Kept = n
		} else {
			m.opts.Logger.ErrorContext(ctx, "idempotency: counting keys failed", "err", cerr)
		}
	}
	if m.opts.OnSweep != nil {
		m.opts.OnSweep(r)
	}
	if r.Behind {
		m.opts.Logger.WarnContext(ctx, "idempotency: sweep behind: expired keys left", "deleted", r.Deleted, "lag", r.Lag, "kept", r.Kept, "took", time.Since(start))
	} else {
		m.opts.Logger.DebugContext(ctx, "idempotency: swept", "deleted", r.Deleted, "lag", r.Lag, "kept", r.Kept, "took", time.Since(start))
	}
	return r, nil
}
