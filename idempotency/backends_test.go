package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/internal/pgtest"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

// A backend is a store with an orders table beside it, as an application
// keeps its own rows in the database that holds its keys.
type backend struct {
	name  string
	store idempotency.Store
	// insert adds an order through the request's transaction and returns
	// its id.
	insert func(ctx context.Context, item string) (int64, error)
	// rows counts the committed orders.
	rows func(t testing.TB) int
	// keys counts the rows of the store's table.
	keys func(t testing.TB) int
	// keyRowBytes is the largest key row's size, but its recorded
	// response (the columns header and body): what a key costs to index.
	keyRowBytes func(t testing.TB) int
	// dsn locates the database for a child process: a SQLite path or a
	// PostgreSQL DSN with its schema.
	kind, dsn string
	// pool is the PostgreSQL pool, nil for SQLite; db the SQLite database,
	// nil for PostgreSQL.
	pool *pgxpool.Pool
	db   *sql.DB
}

func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, nb := range []struct {
		name string
		new  func(t *testing.T) *backend
	}{{"sqlite", sqliteBackend}, {"postgres", pgBackend}} {
		t.Run(nb.name, func(t *testing.T) { f(t, nb.new(t)) })
	}
}

func sqliteBackend(t *testing.T) *backend {
	path := filepath.Join(t.TempDir(), "app.db")
	return openSQLite(t, path)
}

func openSQLite(t testing.TB, path string) *backend {
	db, err := sqlitestore.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqliteOn(context.Background(), db)
	require.NoError(t, err)
	b.dsn = path
	return b
}

func sqliteOn(ctx context.Context, db *sql.DB) (*backend, error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		return nil, err
	}
	st, err := sqlitestore.New(ctx, db)
	if err != nil {
		return nil, err
	}
	return &backend{
		name: "sqlite", kind: "sqlite", store: st, db: db,
		insert: func(ctx context.Context, item string) (int64, error) {
			res, err := sqlitestore.Tx(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, item)
			if err != nil {
				return 0, err
			}
			return res.LastInsertId()
		},
		rows: func(t testing.TB) int {
			var n int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n))
			return n
		},
		keys: func(t testing.TB) int {
			var n int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM idempotency_keys`).Scan(&n))
			return n
		},
		keyRowBytes: func(t testing.TB) int {
			rows, err := db.Query(`SELECT * FROM idempotency_keys`)
			require.NoError(t, err)
			defer rows.Close()
			names, err := rows.Columns()
			require.NoError(t, err)
			largest := 0
			for rows.Next() {
				vals := make([]any, len(names))
				ptrs := make([]any, len(names))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				require.NoError(t, rows.Scan(ptrs...))
				largest = max(largest, keyRowSize(names, vals))
			}
			require.NoError(t, rows.Err())
			return largest
		},
	}, nil
}

func pgBackend(t *testing.T) *backend {
	pool, dsn := pgtest.Pool(t)
	b, err := pgOn(context.Background(), pool)
	require.NoError(t, err)
	b.dsn = dsn
	b.pool = pool
	return b
}

func pgOn(ctx context.Context, pool *pgxpool.Pool) (*backend, error) {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		return nil, err
	}
	st, err := pgstore.New(ctx, pool)
	if err != nil {
		return nil, err
	}
	return &backend{
		name: "postgres", kind: "postgres", store: st,
		insert: func(ctx context.Context, item string) (int64, error) {
			var id int64
			err := pgstore.Tx(ctx).QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&id)
			return id, err
		},
		rows: func(t testing.TB) int {
			var n int
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
			return n
		},
		keys: func(t testing.TB) int {
			var n int
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n))
			return n
		},
		keyRowBytes: func(t testing.TB) int {
			rows, err := pool.Query(context.Background(), `SELECT * FROM idempotency_keys`)
			require.NoError(t, err)
			defer rows.Close()
			var names []string
			for _, f := range rows.FieldDescriptions() {
				names = append(names, f.Name)
			}
			largest := 0
			for rows.Next() {
				vals, err := rows.Values()
				require.NoError(t, err)
				largest = max(largest, keyRowSize(names, vals))
			}
			require.NoError(t, rows.Err())
			return largest
		},
	}, nil
}

// keyRowSize adds up the sizes of a key row's values, but the recorded
// response's (header, body): 8 bytes a number or time.
func keyRowSize(names []string, vals []any) int {
	n := 0
	for i, v := range vals {
		if names[i] == "header" || names[i] == "body" {
			continue
		}
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		case nil:
		default:
			n += 8
		}
	}
	return n
}

// orders is the application: POST /orders creates an order from the body
// and answers 201 with its id. It counts its runs.
type orders struct {
	b    *backend
	runs atomic.Int64
	// before, when set, is called once the row is written and before the
	// handler returns (and so before the commit).
	before func(r *http.Request)
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.runs.Add(1)
	var item [256]byte
	n, _ := r.Body.Read(item[:])
	id, err := o.b.insert(r.Context(), string(item[:n]))
	if err != nil {
		http.Error(w, "insert: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if o.before != nil {
		o.before(r)
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"item":%q}`, id, item[:n])
}

// byHeader is a Principal that reads the X-Tenant header: "" is refused
// (401), "mallory" forbidden (403).
func byHeader(r *http.Request) (string, error) {
	switch p := r.Header.Get("X-Tenant"); p {
	case "":
		return "", fmt.Errorf("no tenant")
	case "mallory":
		return "", fmt.Errorf("tenant %s: %w", p, idempotency.ErrForbidden)
	default:
		return p, nil
	}
}

func pgstorePool(t testing.TB, b *backend) *pgxpool.Pool {
	require.NotNil(t, b.pool, "not a PostgreSQL backend")
	return b.pool
}
