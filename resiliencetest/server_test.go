package resiliencetest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/resilienthttp/resilience/resiliencetest"
)

// newClient returns a client with a transport of its own, closed at the end
// of the test.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func fetch(ctx context.Context, c *http.Client, url string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestServerPlaysTheScript(t *testing.T) {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(
		Fault{Status: 503, RetryAfter: "0", Body: []byte("try later")},
		Fault{Status: 429, RetryAfter: "Wed, 21 Oct 2015 07:28:00 GMT"},
		Fault{Body: []byte("ok")},
	))
	defer srv.Close()
	c := newClient(t)

	type got struct {
		code       int
		retryAfter string
		body       string
	}
	var all []got
	for range 4 {
		resp, body, err := fetch(context.Background(), c, srv.URL())
		require.NoError(t, err)
		all = append(all, got{resp.StatusCode, resp.Header.Get("Retry-After"), body})
	}
	assert.Equal(t, []got{
		{503, "0", "try later"},
		{429, "Wed, 21 Oct 2015 07:28:00 GMT", ""},
		{200, "", "ok"},
		{200, "", "ok"},
	}, all)
	assert.Equal(t, 4, srv.Requests())
	assert.Equal(t, 1, srv.NewConnections(), "a keep-alive client reuses its connection")
	assert.True(t, strings.HasPrefix(srv.URL(), "http://127.0.0.1:"), srv.URL())
}

func TestServerCountsNewConnections(t *testing.T) {
	srv := resiliencetest.NewServer(nil)
	defer srv.Close()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for range 5 {
		resp, _, err := fetch(context.Background(), c, srv.URL())
		require.NoError(t, err)
		assert.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, 5, srv.Requests())
	assert.Equal(t, 5, srv.NewConnections())
}

func TestServerResetIsAConnectionReset(t *testing.T) {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(
		Fault{Reset: true}, Fault{Err: errors.New("also a reset")}, Fault{},
	))
	defer srv.Close()
	c := newClient(t)

	for range 2 {
		_, _, err := fetch(context.Background(), c, srv.URL())
		require.Error(t, err)
		assert.ErrorIs(t, err, syscall.ECONNRESET)
	}
	resp, _, err := fetch(context.Background(), c, srv.URL())
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, 3, srv.Requests())
	assert.Equal(t, 3, srv.NewConnections(), "each reset costs the client its connection")
}

func TestServerHangHonoursTheClientContext(t *testing.T) {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(Fault{Hang: true}, Fault{Delay: time.Hour}, Fault{}))
	defer srv.Close()
	c := newClient(t)

	for range 2 { // the hang, then the long delay
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, _, err := fetch(ctx, c, srv.URL())
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	}
	resp, _, err := fetch(context.Background(), c, srv.URL())
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, 3, srv.Requests())
}

func TestServerDelay(t *testing.T) {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(Fault{Delay: 10 * time.Millisecond, Status: 201}))
	defer srv.Close()
	start := time.Now()
	resp, _, err := fetch(context.Background(), newClient(t), srv.URL())
	require.NoError(t, err)
	assert.Equal(t, 201, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 10*time.Millisecond)
}

func TestServerReadsRequestBodies(t *testing.T) {
	srv := resiliencetest.NewServer(resiliencetest.Sequence(Fault{Status: 503}, Fault{}))
	defer srv.Close()
	c := newClient(t)
	big := strings.Repeat("x", 1<<20) // more than net/http discards for us
	for _, want := range []int{503, 200} {
		resp, err := c.Post(srv.URL(), "text/plain", strings.NewReader(big))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode)
	}
	assert.Equal(t, 1, srv.NewConnections(), "the connection survives a large request body")
}

// TestServerCloseReleasesHangs checks that Close ends the requests that hang
// or wait, without waiting for their clients, and leaves no goroutine.
func TestServerCloseReleasesHangs(t *testing.T) {
	defer goleak.VerifyNone(t)

	srv := resiliencetest.NewServer(resiliencetest.Func(func(n int) Fault {
		if n%2 == 0 {
			return Fault{Hang: true}
		}
		return Fault{Delay: time.Hour}
	}))
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr} // no timeout: only Close can end these

	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			_, _, err := fetch(context.Background(), c, srv.URL())
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return srv.Requests() == n }, 5*time.Second, time.Millisecond)

	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on hanging requests")
	}
	for range n {
		assert.Error(t, <-errs, "a request cut short by Close gets no response")
	}
	srv.Close() // twice is fine
}
