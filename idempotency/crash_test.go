package idempotency_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/idempotency"
	"github.com/resilienthttp/resilience/idempotency/sqlitestore"
)

// The crash tests run a real server in a child process (this test binary,
// re-executed with childEnv set), and SIGKILL it at a point its handler
// signals on its standard output: "mutated" (the order row written in the
// transaction, not committed) or "committed" (the response recorded and
// committed, not yet sent).
const (
	childEnv   = "IDEMPOTENCY_TEST_CHILD"
	crashLease = time.Second
)

// runChild serves POST /orders on a loopback port until killed. It prints
// "listen ADDR" once serving, then the signal of its mode.
func runChild() {
	ctx := context.Background()
	kind, dsn, mode := os.Getenv("IDEM_KIND"), os.Getenv("IDEM_DSN"), os.Getenv("IDEM_MODE")
	var (
		b   *backend
		err error
	)
	switch kind {
	case "sqlite":
		db, oerr := sqlitestore.Open(dsn)
		if oerr != nil {
			fatal(oerr)
		}
		b, err = sqliteOn(ctx, db)
	case "postgres":
		pool, perr := pgxpool.New(ctx, dsn)
		if perr != nil {
			fatal(perr)
		}
		b, err = pgOn(ctx, pool)
	default:
		err = fmt.Errorf("unknown IDEM_KIND %q", kind)
	}
	if err != nil {
		fatal(err)
	}
	app := &orders{b: b}
	if mode == "mutated" {
		app.before = func(*http.Request) {
			fmt.Println("mutated")
			select {} // until killed
		}
	}
	mw, err := idempotency.New(b.store, idempotency.Options{Principal: byHeader, Lease: crashLease})
	if err != nil {
		fatal(err)
	}
	h := mw.Handler(app)
	if mode == "committed" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(stallWriter{w}, r)
		})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatal(err)
	}
	fmt.Println("listen", ln.Addr())
	fatal(http.Serve(ln, h))
}

// stallWriter signals "committed" when the middleware starts its answer,
// which it does after the commit, and never sends it.
type stallWriter struct{ http.ResponseWriter }

func (w stallWriter) WriteHeader(int) {
	fmt.Println("committed")
	select {}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "child:", err)
	os.Exit(2)
}

// redirect sends each request to the host target holds at the time.
type redirect struct {
	base   http.RoundTripper
	target *atomic.Pointer[string]
}

func (r redirect) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Host = *r.target.Load()
	req.Host = ""
	return r.base.RoundTrip(req)
}

// A server killed between the claim and the commit leaves a claim; the
// client's retry goes to a new server on the same database, gets 409 until
// the lease expires, then claims the key and creates the one row. A server
// killed after the commit leaves a completed key, which the retry gets
// replayed, without running the handler again.
func TestKilledServer(t *testing.T) {
	for _, mode := range []string{"mutated", "committed"} {
		t.Run(mode, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *backend) { killedServer(t, b, mode) })
		})
	}
}

func killedServer(t *testing.T, b *backend, mode string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "IDEM_KIND="+b.kind, "IDEM_DSN="+b.dsn, "IDEM_MODE="+mode)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child exited")
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("the child said nothing for 30s")
		}
		return ""
	}
	childAddr, ok := strings.CutPrefix(next(), "listen ")
	require.True(t, ok)

	// The server that takes over, on the same database.
	app := &orders{b: b}
	srv := httptest.NewServer(middleware(t, b, idempotency.Options{Lease: crashLease}).Handler(app))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)

	var target atomic.Pointer[string]
	target.Store(&childAddr)
	client := newClient(t, redirect{base: newBase(t), target: &target})
	type result struct {
		resp *http.Response
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Do(post(t, "http://"+childAddr, "widget", ""))
		r := result{resp: resp, err: err}
		if err == nil {
			r.body = answer(t, resp)
		}
		done <- r
	}()

	require.Equal(t, mode, next())
	target.Store(&u.Host) // retries go to the new server
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed = true
	for range lines {
	}

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusCreated, r.resp.StatusCode, r.body)
	assert.Contains(t, r.body, `"item":"widget"`)
	assert.Equal(t, 1, b.rows(t), "rows")
	switch mode {
	case "mutated": // the child's row was rolled back; the new server made one
		assert.EqualValues(t, 1, app.runs.Load())
		assert.Empty(t, r.resp.Header.Get(idempotency.ReplayedHeader))
	case "committed": // the child's row and answer stand; replayed
		assert.EqualValues(t, 0, app.runs.Load())
		assert.Equal(t, "true", r.resp.Header.Get(idempotency.ReplayedHeader))
	}
}
