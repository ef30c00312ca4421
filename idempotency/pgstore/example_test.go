package pgstore_test

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
)

// A POST /orders handler on PostgreSQL: the order row is inserted through
// the middleware's transaction, so it commits with the recorded answer.
// (Not run: it needs a server.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool)
	if err != nil {
		panic(err)
	}
	mw, err := idempotency.New(store, idempotency.Options{
		Principal: func(r *http.Request) (string, error) {
			if t := r.Header.Get("X-Tenant"); t != "" { // authenticate properly here
				return t, nil
			}
			return "", fmt.Errorf("no tenant")
		},
	})
	if err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		panic(err)
	}
	http.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := pgstore.Tx(r.Context())
		if tx == nil { // no Idempotency-Key: no transaction (or set RequireKey)
			http.Error(w, "an Idempotency-Key is required", http.StatusBadRequest)
			return
		}
		var id int64
		err := tx.QueryRow(r.Context(),
			`INSERT INTO orders (item) VALUES ($1) RETURNING id`, r.FormValue("item")).Scan(&id)
		if err != nil {
			http.Error(w, "could not create the order", http.StatusInternalServerError) // rolls back, releases the key
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
}
