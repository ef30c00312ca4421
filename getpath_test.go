package resilience

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// The path of one GET through the standard handler, for bench/getpath.sh,
// which runs these two tests apart under coverage and names the files whose
// statements the GET ran beyond what building the handler ran: the files a
// reader follows a call through. Both also run with the suite, as a check
// that the path they measure is the success path.

func getPathServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestGetPathBuild(t *testing.T) {
	getPathServer(t) // as the GET's test does, so that only the GET differs
	tr, err := NewTransport(&http.Transport{}, Options{})
	require.NoError(t, err)
	require.NotNil(t, tr.Handler())
	tr.CloseIdleConnections()
}

func TestGetPathGET(t *testing.T) {
	srv := getPathServer(t)
	tr, err := NewTransport(&http.Transport{}, Options{})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "ok", string(b))
	tr.CloseIdleConnections()
}
