package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
	"github.com/resilienthttp/resilience/idempotency/storetest"
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
	storetest.Run(t, s, func(ctx context.Context) bool { return sqlitestore.Tx(ctx) != nil })

	n, lag, err := s.Sweep(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, lag, "nothing expired")
	assert.Zero(t, n, "nothing expired")
	_, err = sqlitestore.New(ctx, nil)
	assert.ErrorContains(t, err, "sqlitestore: nil")
}

// A table of the earlier layout (keyed by principal, operation and key) is
// refused by name, not used.
func TestEarlierLayout(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "s.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE idempotency_keys (principal TEXT, operation TEXT, key TEXT, digest BLOB, token BLOB, lease_until INTEGER, expires_at INTEGER, status INTEGER, header BLOB, body BLOB, PRIMARY KEY (principal, operation, key)) WITHOUT ROWID`)
	require.NoError(t, err)
	_, err = sqlitestore.New(ctx, db)
	assert.ErrorContains(t, err, "sqlitestore: table idempotency_keys has an earlier layout")
}
