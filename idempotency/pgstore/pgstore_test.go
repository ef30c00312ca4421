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
	assert.Contains(t, pgstore.Schema(), "PRIMARY KEY (principal, operation, key)")
	storetest.Run(t, s, func(ctx context.Context) bool { return pgstore.Tx(ctx) != nil })

	n, err := s.Sweep(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = pgstore.New(ctx, nil)
	assert.ErrorContains(t, err, "pgstore: nil")
}
