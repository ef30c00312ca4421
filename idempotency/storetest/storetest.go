// Package storetest checks that an idempotency.Store keeps the claim
// protocol's state machine, as golang.org/x/net/nettest checks a net.Conn:
// the module's stores run it, and so can a store of your own.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
)

// Run walks one key of s through the protocol: a first claim is Owned,
// and its transaction reaches the store's accessor (hasTx reports whether
// a context carries it); a second is InProgress with the first's digest
// and the lease left; an abort frees the key, so the next claim is Owned
// again; after its commit (which the first abort, tried again, leaves
// alone), a claim with another digest finds it Completed,
// with the recorded digest and response. Then a live owner outlives its
// lease (see liveOwner). The keys are ones no other test uses, so s may be
// shared.
func Run(t *testing.T, s idempotency.Store, hasTx func(context.Context) bool) {
	t.Helper()
	ctx := context.Background()
	assert.False(t, hasTx(ctx), "no transaction outside a claim")

	req := idempotency.ClaimRequest{
		Key:    idempotency.Key{Principal: "storetest", Operation: "POST /x", Key: t.Name() + time.Now().Format(time.RFC3339Nano)},
		Digest: idempotency.Digest{1},
		Lease:  time.Minute,
		TTL:    time.Hour,
	}
	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State)
	assert.True(t, hasTx(c.Txn.Context(ctx)), "the owner's transaction reaches the accessor")

	again, err := s.Claim(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, idempotency.InProgress, again.State)
	assert.Equal(t, req.Digest, again.Digest)
	assert.InDelta(t, time.Minute, again.LeaseLeft, float64(time.Second))

	require.NoError(t, c.Txn.Abort(ctx))
	aborted := c
	c, err = s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State, "released by the abort")
	require.NoError(t, c.Txn.Commit(ctx, &idempotency.Response{Status: 201, Body: []byte("made")}))
	// An abort tried again (as after a failure) releases only its own
	// claim, never a key that another owner then completed.
	require.NoError(t, aborted.Txn.Abort(ctx), "an abort tried again")

	other := req
	other.Digest = idempotency.Digest{2}
	done, err := s.Claim(ctx, other)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Completed, done.State)
	assert.Equal(t, req.Digest, done.Digest, "the recorded digest, for the caller to compare")
	require.NotNil(t, done.Response)
	assert.Equal(t, 201, done.Response.Status)
	assert.Equal(t, "made", string(done.Response.Body))

	liveOwner(t, s)
	sweep(t, s)
}

// sweepTTL is the TTL of sweep's key: short, so that the test outlives it.
const sweepTTL = 20 * time.Millisecond

// sweep checks Store.Sweep: a completed key past its TTL is deleted, and
// the lag reported is at least how long it has been expired. A KeyCounter
// counts the keys.
func sweep(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	req := idempotency.ClaimRequest{
		Key:    idempotency.Key{Principal: "storetest", Operation: "POST /sweep", Key: t.Name() + time.Now().Format(time.RFC3339Nano)},
		Digest: idempotency.Digest{4},
		Lease:  sweepTTL,
		TTL:    sweepTTL,
	}
	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State)
	require.NoError(t, c.Txn.Commit(ctx, &idempotency.Response{Status: 201}))
	time.Sleep(3 * sweepTTL) // expired for at least 2 × sweepTTL
	n, lag, err := s.Sweep(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one expired key deleted, the limit")
	assert.GreaterOrEqual(t, lag, 2*sweepTTL, "the oldest expired key's lag")
	if kc, ok := s.(idempotency.KeyCounter); ok {
		n, err := kc.CountKeys(ctx)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, 0)
	}
}

// liveOwnerLease is the lease of liveOwner's claim: short, so that the test
// outlives it.
const liveOwnerLease = 50 * time.Millisecond

// liveOwner checks the Store contract for an owner that outlives its lease
// while alive (its transaction still open): its key is not taken over, as
// it would be from an owner that died. A claim of the key meanwhile
// reports it InProgress, or waits until the owner's transaction ends (a
// store with one writer at a time, as SQLite) and reports what it left;
// it is never Owned. The owner's commit then lands, and the key replays.
func liveOwner(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	req := idempotency.ClaimRequest{
		Key:    idempotency.Key{Principal: "storetest", Operation: "POST /live", Key: t.Name() + time.Now().Format(time.RFC3339Nano)},
		Digest: idempotency.Digest{3},
		Lease:  liveOwnerLease,
		TTL:    time.Hour,
	}
	owner, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, owner.State)
	time.Sleep(2 * liveOwnerLease) // the owner, alive, outlives its lease

	type result struct {
		claim idempotency.Claim
		err   error
	}
	retried := make(chan result, 1)
	go func() {
		c, err := s.Claim(ctx, req)
		retried <- result{c, err}
	}()
	check := func(r result) {
		t.Helper()
		require.NoError(t, r.err)
		if r.claim.State == idempotency.Owned {
			_ = r.claim.Txn.Abort(ctx)
		}
		assert.NotEqual(t, idempotency.Owned, r.claim.State, "a live owner's key was taken over: its handler would run twice")
		if r.claim.State == idempotency.Completed {
			assert.Equal(t, 201, r.claim.Response.Status)
		}
	}
	// Either the claim answers at once (InProgress), or it waits for the
	// owner's transaction: the owner commits meanwhile in both cases.
	select {
	case r := <-retried:
		check(r)
		retried = nil
	case <-time.After(liveOwnerLease):
	}
	assert.NoError(t, owner.Txn.Commit(ctx, &idempotency.Response{Status: 201, Body: []byte("once")}), "the live owner's commit lands")
	if retried != nil {
		check(<-retried)
	}

	done, err := s.Claim(ctx, req)
	require.NoError(t, err)
	if done.State == idempotency.Owned {
		_ = done.Txn.Abort(ctx)
	}
	require.Equal(t, idempotency.Completed, done.State)
	assert.Equal(t, "once", string(done.Response.Body))
}
