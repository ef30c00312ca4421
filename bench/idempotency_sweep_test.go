package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/pgstore"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

// The sweep's scenario, issue 29 item 12, scaled as the issue scaled it:
// the defaults' deletion rate (SweepBatch 1000 per SweepInterval 1 min)
// becomes 10 per 600 ms, with a TTL of 200 ms, so that keys expire within
// the run. Keyed writes arrive open loop at the rate for sweepWriting,
// then stop; the table is counted every 100 ms, at the end of the writes
// and sweepAfter later.
const (
	sweepTTL      = 200 * time.Millisecond
	sweepInterval = 600 * time.Millisecond
	sweepBatch    = 10
	sweepWriting  = 10 * time.Second
	sweepAfter    = 2 * time.Second
	sweepWorkers  = 32 // PostgreSQL's writers
	sqliteWorkers = 4  // SQLite has one writer: more only wait on its lock
)

// openSQLite opens path as sqlitestore.Open does, with synchronous FULL
// (Open's, SQLite's default: an fsync per commit, 1.8 ms each on this
// machine's disk, two commits a keyed write) or NORMAL (in WAL mode, no
// fsync per commit: a power cut may lose the last commits, never a
// commit's half). At FULL the disk, not the sweep, caps the write rate.
func openSQLite(path, sync string) (*sql.DB, error) {
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", "synchronous("+sync+")")
	return sql.Open("sqlite", "file:"+path+"?"+q.Encode())
}

// BenchmarkIdempotencySweep drives keyed writes at 200 and 2,000 a second
// through the middleware (in process: its handler answers 201 and writes
// nothing else, so the keys are all the store holds) on SQLite (4 workers,
// synchronous FULL and NORMAL) and on PostgreSQL (32 workers), and
// reports, once per round (run it with -benchtime 1x):
//
//   - writes/s: the rate achieved (the open loop's writes that completed
//     with 201, over the writing time);
//   - rows-peak, rows-end, rows-2s: the keys in the table, at most while
//     writing, when the writes stop, and 2 s later (sweeps run on writes,
//     so none comes after the last);
//   - bound: what TTL implies, (TTL + SweepInterval) × writes/s: keys live
//     for the TTL, and expired ones wait at most an interval for a sweep;
//   - deleted, sweeps, behind: keys the sweeps deleted, the sweeps, and how
//     many stopped behind (SweepReport);
//   - lag-max-ms: the largest SweepReport.Lag.
//
// PostgreSQL needs RESILIENCE_TEST_POSTGRES_DSN (bench/idempotency-sweep.sh
// starts a server); without it, the store=postgres cases are skipped.
func BenchmarkIdempotencySweep(b *testing.B) {
	for _, rate := range []int{200, 2000} {
		for _, sync := range []string{"full", "normal"} {
			b.Run(fmt.Sprintf("store=sqlite-%s/rate=%d", sync, rate), func(b *testing.B) {
				for range b.N {
					db, err := openSQLite(filepath.Join(b.TempDir(), "sweep.db"), sync)
					if err != nil {
						b.Fatal(err)
					}
					st, err := sqlitestore.New(context.Background(), db)
					if err != nil {
						b.Fatal(err)
					}
					sweepRun(b, st, rate, sqliteWorkers, func() int {
						var n int
						if err := db.QueryRow(`SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil {
							b.Fatal(err)
						}
						return n
					})
					db.Close()
				}
			})
		}
		b.Run(fmt.Sprintf("store=postgres/rate=%d", rate), func(b *testing.B) {
			dsn := os.Getenv("RESILIENCE_TEST_POSTGRES_DSN")
			if dsn == "" {
				b.Skip("PostgreSQL not available: RESILIENCE_TEST_POSTGRES_DSN is not set (bench/idempotency-sweep.sh starts a server)")
			}
			ctx := context.Background()
			for range b.N {
				cfg, err := pgxpool.ParseConfig(dsn)
				if err != nil {
					b.Fatal(err)
				}
				cfg.MaxConns = sweepWorkers + 4
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS idempotency_keys`); err != nil {
					b.Fatal(err)
				}
				st, err := pgstore.New(ctx, pool)
				if err != nil {
					b.Fatal(err)
				}
				sweepRun(b, st, rate, sweepWorkers, func() int {
					var n int
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil {
						b.Fatal(err)
					}
					return n
				})
				pool.Close()
			}
		})
	}
}

// sweepRun is one round at rate writes a second on st; count counts the
// keys in its table exactly (count(*), not the store's estimate).
func sweepRun(b *testing.B, st idempotency.Store, rate, workers int, count func() int) {
	var (
		mu      sync.Mutex
		reports []idempotency.SweepReport
	)
	mw, err := idempotency.New(st, idempotency.Options{
		Principal:     func(*http.Request) (string, error) { return "bench", nil },
		TTL:           sweepTTL,
		Lease:         sweepTTL,
		SweepInterval: sweepInterval,
		SweepBatch:    sweepBatch,
		OnSweep: func(r idempotency.SweepReport) {
			mu.Lock()
			reports = append(reports, r)
			mu.Unlock()
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))

	var created, failed atomic.Int64
	ticks := make(chan int, 100_000)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range ticks {
				req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("teapot"))
				req.Header.Set("Idempotency-Key", fmt.Sprintf("k-%d-%d", time.Now().UnixNano(), i))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code == http.StatusCreated {
					created.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	peak := 0
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				peak = max(peak, count())
			}
		}
	}()

	b.ResetTimer()
	start := time.Now()
	total := int(float64(rate) * sweepWriting.Seconds())
	dropped := 0
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		select {
		case ticks <- i:
		default:
			dropped++ // the workers are that far behind: not offered
		}
	}
	close(ticks)
	wg.Wait()
	writing := time.Since(start)
	close(stopSampling)
	<-sampled
	end := count()
	peak = max(peak, end)
	time.Sleep(sweepAfter)
	after := count()
	b.StopTimer()

	achieved := float64(created.Load()) / writing.Seconds()
	mu.Lock()
	deleted, behind := 0, 0
	var lagMax time.Duration
	for _, r := range reports {
		deleted += r.Deleted
		lagMax = max(lagMax, r.Lag)
		if r.Behind {
			behind++
		}
	}
	sweeps := len(reports)
	mu.Unlock()
	b.ReportMetric(achieved, "writes/s")
	b.ReportMetric(float64(failed.Load()+int64(dropped)), "not-201")
	b.ReportMetric(float64(peak), "rows-peak")
	b.ReportMetric(float64(end), "rows-end")
	b.ReportMetric(float64(after), "rows-2s")
	b.ReportMetric(achieved*(sweepTTL+sweepInterval).Seconds(), "bound")
	b.ReportMetric(float64(deleted), "deleted")
	b.ReportMetric(float64(sweeps), "sweeps")
	b.ReportMetric(float64(behind), "behind")
	b.ReportMetric(float64(lagMax)/float64(time.Millisecond), "lag-max-ms")
}
