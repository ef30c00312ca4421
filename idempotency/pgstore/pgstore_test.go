package pgstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/idempotency/internal/pgtest"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
	"github.com/resilienthttp/resilience/idempotency/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The store's state machine, without the middleware.
func TestClaimStates(t *testing.T) {
	ctx := context.Background()
	p, _ := pgtest.Pool(t)
	s, err := pgstore.New(ctx, p)
	require.NoError(t, err)
	assert.Contains(t, pgstore.Schema(), "key_hash    bytea       PRIMARY KEY")
	storetest.Run(t, s, func(ctx context.Context) bool { return pgstore.Tx(ctx) != nil })

	n, lag, err := s.Sweep(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, lag, "nothing expired")
	assert.Zero(t, n)
	_, err = pgstore.New(ctx, nil)
	assert.ErrorContains(t, err, "pgstore: nil")
}

// A table of the earlier layout (keyed by principal, operation and key, which
// PostgreSQL cannot index past 2,704 bytes) is refused by name, not used.
func TestEarlierLayout(t *testing.T) {
	ctx := context.Background()
	p, _ := pgtest.Pool(t)
	_, err := p.Exec(ctx, `CREATE TABLE idempotency_keys (principal text, operation text, key text, digest bytea, token bytea, lease_until timestamptz, expires_at timestamptz, status integer, header bytea, body bytea, PRIMARY KEY (principal, operation, key))`)
	require.NoError(t, err)
	_, err = pgstore.New(ctx, p)
	assert.ErrorContains(t, err, "pgstore: table idempotency_keys has an earlier layout")
}
