package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// A POST that creates a row, retried safely through a flaky network: the
// first attempt's connection is reset before it is sent, the second runs
// and commits but its answer is lost, and so is the third's (a replay);
// the fourth gets the first's 201 replayed. One row.
func Example() {
	dir, _ := os.MkdirTemp("", "idempotency-example")
	defer os.RemoveAll(dir)
	db, err := sqlitestore.Open(filepath.Join(dir, "shop.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)`); err != nil {
		panic(err)
	}
	store, err := sqlitestore.New(context.Background(), db)
	if err != nil {
		panic(err)
	}

	// The server: the order and its recorded answer commit together.
	mw, err := idempotency.New(store, idempotency.Options{
		Principal: func(r *http.Request) (string, error) { return "shop", nil }, // one tenant
	})
	if err != nil {
		panic(err)
	}
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := sqlitestore.Tx(r.Context())
		if tx == nil { // no Idempotency-Key: no transaction (or set RequireKey)
			http.Error(w, "an Idempotency-Key is required", http.StatusBadRequest)
			return
		}
		item, _ := io.ReadAll(r.Body)
		res, err := tx.ExecContext(r.Context(), `INSERT INTO orders (item) VALUES (?)`, string(item))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d: %s", id, item)
	})
	lostAnswers := resiliencetest.Sequence(reset, reset, pass)
	srv := httptest.NewServer(lossy(lostAnswers, mw.Handler(create)))
	defer srv.Close()

	// The client: the upstream keeps the protocol, so its POSTs get a key
	// and are retried like GETs.
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	flaky := resiliencetest.NewTransport(base, resiliencetest.Sequence(reset, pass))
	rt, err := resilience.NewTransport(flaky, resilience.Options{
		Idempotency: resilience.IdempotencyOptions{Enabled: true},
		Retry:       resilience.RetryOptions{Delay: time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}

	resp, err := client.Post(srv.URL+"/orders", "text/plain", strings.NewReader("one teapot"))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idempotency.ReplayedHeader))
	fmt.Println("attempts:", flaky.Requests())
	fmt.Println("rows:", countRows(db))
	// Output:
	// 201 order 1: one teapot replayed: true
	// attempts: 4
	// rows: 1
}

func countRows(db *sql.DB) int {
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		panic(err)
	}
	return n
}
