package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience"
	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/resiliencetest"
)

// 64 callers, 16 keys (4 callers each, started together), on PostgreSQL,
// with connection resets at random before requests reach the server and
// after it has answered, and the client retrying through them: 16 rows,
// and every caller gets 201 with the body of its key's row. Every retry
// must run for that, so what may refuse one is off: the retry budget, the
// breaker and the overload limiter, which sheds a retry once answers come
// three times slower than usual, as these do when 64 callers start together
// (281 ms against a usual 90 in a run that failed with it on: a reset was
// then answered as a bare client answers it, with the error).
func TestConcurrentCallersPostgres(t *testing.T) {
	b := pgBackend(t)
	app := &orders{b: b}
	lost := resiliencetest.Mix(11, resiliencetest.Weighted{Weight: 4, Fault: pass}, resiliencetest.Weighted{Weight: 1, Fault: reset})
	srv := httptest.NewServer(lossy(lost, middleware(t, b, idempotency.Options{}).Handler(app)))
	defer srv.Close()
	dropped := resiliencetest.Mix(12, resiliencetest.Weighted{Weight: 4, Fault: pass}, resiliencetest.Weighted{Weight: 1, Fault: reset})
	requests := resiliencetest.NewTransport(newBase(t), dropped)
	rt, err := resilience.NewTransport(requests, resilience.Options{
		Idempotency:    resilience.IdempotencyOptions{Enabled: true},
		Retry:          resilience.RetryOptions{MaxRetries: 12, Delay: time.Millisecond, MaxDelay: 20 * time.Millisecond},
		RetryBudget:    resilience.RetryBudgetOptions{Disabled: true},
		CircuitBreaker: resilience.CircuitBreakerOptions{Disabled: true},
		Overload:       resilience.OverloadOptions{Disabled: true},
		TotalTimeout:   time.Minute,
	})
	require.NoError(t, err)
	client := &http.Client{Transport: rt}

	const callers, keys = 64, 16
	type got struct {
		status int
		item   string
		body   string
		err    error
	}
	results := make([]got, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := i % keys
			item := fmt.Sprintf("item-%d", k)
			<-start
			resp, err := client.Do(post(t, srv.URL, item, fmt.Sprintf("key-%d", k)))
			results[i] = got{item: item, err: err}
			if err == nil {
				results[i].status = resp.StatusCode
				results[i].body = answer(t, resp)
			}
		}()
	}
	close(start)
	wg.Wait()

	require.Equal(t, keys, b.rows(t), "rows")
	ids := make(map[string]int64)
	rows, err := pgstorePool(t, b).Query(context.Background(), `SELECT id, item FROM orders`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var item string
		require.NoError(t, rows.Scan(&id, &item))
		ids[item] = id
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, keys, "one row per key")
	for i, r := range results {
		require.NoError(t, r.err, "caller %d", i)
		assert.Equal(t, http.StatusCreated, r.status, "caller %d: %s", i, r.body)
		assert.Equal(t, fmt.Sprintf(`{"id":%d,"item":%q}`, ids[r.item], r.item), r.body, "caller %d", i)
	}
	assert.EqualValues(t, keys, app.runs.Load(), "handler runs")
	assert.Greater(t, requests.Requests(), callers+keys, "the resets were retried")
	t.Logf("%d attempts for %d calls", requests.Requests(), callers)
}
