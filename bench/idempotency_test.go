package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

// BenchmarkIdempotency measures the latency the idempotency middleware adds
// to a POST that inserts one row, over loopback keep-alive, one request at a
// time, against the same handler without it:
//
//   - mw=bare: the handler inserts its row in its own autocommit statement;
//   - mw=new-key: through the middleware, a fresh key each request (claim,
//     the handler's insert in the middleware's transaction, the recorded
//     response, commit);
//   - mw=replay: through the middleware, the same key each request (a
//     lookup and a replay; the handler does not run).
//
// It reports p50-µs and p99-µs of the per-request wall time. PostgreSQL
// needs RESILIENCE_TEST_POSTGRES_DSN (bench/idempotency.sh starts a
// server); without it, the store=postgres cases are skipped.
func BenchmarkIdempotency(b *testing.B) {
	b.Run("store=sqlite", func(b *testing.B) {
		db, err := sqlitestore.Open(filepath.Join(b.TempDir(), "bench.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		st, err := sqlitestore.New(context.Background(), db)
		if err != nil {
			b.Fatal(err)
		}
		insert := func(ctx context.Context, tx bool) error {
			var x interface {
				ExecContext(context.Context, string, ...any) (sql.Result, error)
			} = db
			if tx {
				x = sqlitestore.Tx(ctx)
			}
			_, err := x.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('teapot')`)
			return err
		}
		idempotencyCases(b, st, insert)
	})
	b.Run("store=postgres", func(b *testing.B) {
		dsn := os.Getenv("RESILIENCE_TEST_POSTGRES_DSN")
		if dsn == "" {
			b.Skip("PostgreSQL not available: RESILIENCE_TEST_POSTGRES_DSN is not set (bench/idempotency.sh starts a server)")
		}
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS orders, idempotency_keys;
			CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		st, err := pgstore.New(ctx, pool)
		if err != nil {
			b.Fatal(err)
		}
		insert := func(ctx context.Context, tx bool) error {
			var err error
			if tx {
				_, err = pgstore.Tx(ctx).Exec(ctx, `INSERT INTO orders (item) VALUES ('teapot')`)
			} else {
				_, err = pool.Exec(ctx, `INSERT INTO orders (item) VALUES ('teapot')`)
			}
			return err
		}
		idempotencyCases(b, st, insert)
	})
}

func idempotencyCases(b *testing.B, st idempotency.Store, insert func(ctx context.Context, tx bool) error) {
	mw, err := idempotency.New(st, idempotency.Options{
		Principal: func(*http.Request) (string, error) { return "bench", nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(tx bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := insert(r.Context(), tx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":1,"item":"teapot"}`)
		})
	}
	run := 0
	for _, c := range []struct {
		name string
		h    http.Handler
		key  func(i int) string
	}{
		{"bare", handler(false), func(int) string { return "" }},
		{"new-key", mw.Handler(handler(true)), func(i int) string { return fmt.Sprintf("k-%d-%d-%d", time.Now().UnixNano(), run, i) }},
		{"replay", mw.Handler(handler(true)), func(int) string { return "the-same-key" }},
	} {
		b.Run("mw="+c.name, func(b *testing.B) {
			run++
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("teapot"))
				if k := c.key(i); k != "" {
					req.Header.Set("Idempotency-Key", k)
				}
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(start))
				if resp.StatusCode != http.StatusCreated {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
			b.ReportMetric(us(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-µs")
		})
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
