package sqlitestore_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/idempotency"
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

// A sweep that runs between a claim's commit and its owner's BEGIN
// IMMEDIATE (it took the write lock first), once the claim's TTL has
// passed, deletes the claim. The write, with a key nobody else sent, still
// gets its 201 and its key is recorded: the owner makes its claim again
// in its own transaction, once it holds the write lock. Before, the
// handler ran and its commit found the claim gone: 409, "the lease of
// this request expired and a retry took it over".
func TestSweepBeforeTheOwnerBegins(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "s.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	s, err := sqlitestore.New(ctx, db)
	require.NoError(t, err)
	const ttl = 10 * time.Millisecond
	mw, err := idempotency.New(s, idempotency.Options{
		Principal:     func(*http.Request) (string, error) { return "acme", nil },
		TTL:           ttl,
		Lease:         ttl,
		SweepInterval: -1,
	})
	require.NoError(t, err)
	swept := -1
	sqlitestore.SetBeforeBegin(s, func() {
		time.Sleep(2 * ttl) // the claim's TTL has passed
		r, err := mw.Sweep(ctx)
		assert.NoError(t, err)
		swept = r.Deleted
	})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := sqlitestore.Tx(r.Context()).ExecContext(r.Context(), `INSERT INTO orders (item) VALUES ('widget')`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("widget"))
	req.Header.Set("Idempotency-Key", "k-once")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	require.Equal(t, 1, swept, "the sweep ran between the claim's commit and the owner's BEGIN, and deleted the claim")
	assert.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var orders, completed int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	assert.Equal(t, 1, orders, "the handler's row committed")
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM idempotency_keys WHERE status = 201`).Scan(&completed))
	assert.Equal(t, 1, completed, "the key recorded with its response")
}
