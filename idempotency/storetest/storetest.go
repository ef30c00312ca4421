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
// again; after a commit, a claim with another digest finds it Completed,
// with the recorded digest and response. The key is one no other test
// uses, so s may be shared.
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
	c, err = s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State, "released by the abort")
	require.NoError(t, c.Txn.Commit(ctx, &idempotency.Response{Status: 201, Body: []byte("made")}))

	other := req
	other.Digest = idempotency.Digest{2}
	done, err := s.Claim(ctx, other)
	require.NoError(t, err)
	assert.Equal(t, idempotency.Completed, done.State)
	assert.Equal(t, req.Digest, done.Digest, "the recorded digest, for the caller to compare")
	require.NotNil(t, done.Response)
	assert.Equal(t, 201, done.Response.Status)
	assert.Equal(t, "made", string(done.Response.Body))
}
