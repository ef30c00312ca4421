package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The store's state machine, without the middleware: claim, in progress,
// commit, completed; abort releases; another digest is reported as such.
func TestClaimStates(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "s.db"))
	require.NoError(t, err)
	defer db.Close()
	s, err := sqlitestore.New(ctx, db)
	require.NoError(t, err)
	_, err = sqlitestore.New(ctx, db) // idempotent
	require.NoError(t, err)
	assert.Nil(t, sqlitestore.Tx(ctx))

	req := idempotency.ClaimRequest{Key: idempotency.Key{Principal: "p", Operation: "POST /x", Key: "k"}, Digest: idempotency.Digest{1}, Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State)
	assert.NotNil(t, sqlitestore.Tx(c.Txn.Context(ctx)))

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
	assert.Equal(t, 201, done.Response.Status)
	assert.Equal(t, "made", string(done.Response.Body))

	n, err := s.Sweep(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing expired")
	_, err = sqlitestore.New(ctx, nil)
	assert.ErrorContains(t, err, "sqlitestore: nil")
}
