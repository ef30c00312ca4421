// Package pgtest gives the idempotency module's tests a PostgreSQL pool of
// their own: the server RESILIENCE_TEST_POSTGRES_DSN names (.ci/postgres.sh
// starts one), in a fresh schema dropped when the test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Pool connects to the PostgreSQL server named by
// RESILIENCE_TEST_POSTGRES_DSN (.ci/postgres.sh starts one), in a schema of
// the test's own. Without a server the test is skipped, loudly, unless
// RESILIENCE_REQUIRE_SERVERS=1, when it fails.
func Pool(t testing.TB) (*pgxpool.Pool, string) {
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
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dsn)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			c.Close(context.Background())
		}
	})
	sdsn := withSchema(dsn, schema)
	pool := newPool(t, sdsn)
	return pool, sdsn
}

// withSchema sets the search path of dsn (a URL) to schema.
func withSchema(dsn, schema string) string {
	sep := "?"
	for _, c := range dsn {
		if c == '?' {
			sep = "&"
		}
	}
	return dsn + sep + "search_path=" + schema
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
