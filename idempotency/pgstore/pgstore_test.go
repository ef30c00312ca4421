package pgstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pool connects to RESILIENCE_TEST_POSTGRES_DSN in a fresh schema; without a
// server the test is skipped, loudly, unless RESILIENCE_REQUIRE_SERVERS=1.
func pool(t *testing.T) *pgxpool.Pool {
	dsn := os.Getenv("RESILIENCE_TEST_POSTGRES_DSN")
	unavailable := func(why string) {
		if os.Getenv("RESILIENCE_REQUIRE_SERVERS") == "1" {
			t.Fatalf("PostgreSQL not available, and RESILIENCE_REQUIRE_SERVERS=1: %s", why)
		}
		t.Skipf("PostgreSQL not available: %s (source .ci/postgres.sh to start one)", why)
	}
	if dsn == "" {
		unavailable("RESILIENCE_TEST_POSTGRES_DSN is not set")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		unavailable(err.Error())
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `DROP SCHEMA IF EXISTS pgstore_test CASCADE; CREATE SCHEMA pgstore_test`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "pgstore_test"
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// The store's state machine, without the middleware.
func TestClaimStates(t *testing.T) {
	ctx := context.Background()
	p := pool(t)
	s, err := pgstore.New(ctx, p)
	require.NoError(t, err)
	assert.Contains(t, pgstore.Schema(), "PRIMARY KEY (principal, operation, key)")
	assert.Nil(t, pgstore.Tx(ctx))

	req := idempotency.ClaimRequest{Key: idempotency.Key{Principal: "p", Operation: "POST /x", Key: "k"}, Digest: idempotency.Digest{1}, Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.Owned, c.State)
	assert.NotNil(t, pgstore.Tx(c.Txn.Context(ctx)))

	again, err := s.Claim(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, idempotency.InProgress, again.State)
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
	assert.Equal(t, req.Digest, done.Digest)
	assert.Equal(t, "made", string(done.Response.Body))

	n, err := s.Sweep(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = pgstore.New(ctx, nil)
	assert.ErrorContains(t, err, "pgstore: nil")
}
