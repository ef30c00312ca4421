package resilience

import (
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, time.March, 4, 5, 6, 7, 0, time.UTC)
	later := now.Add(90 * time.Second)
	cases := []struct {
		name  string
		value string
		want  time.Duration
		ok    bool
	}{
		{"zero", "0", 0, true},
		{"seconds", "120", 120 * time.Second, true},
		{"padded", " 5 ", 5 * time.Second, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"IMF-fixdate", later.Format(http.TimeFormat), 90 * time.Second, true},
		{"RFC 850", later.Format(time.RFC850), 90 * time.Second, true},
		{"asctime", later.Format(time.ANSIC), 90 * time.Second, true},
		{"literal IMF-fixdate", "Tue, 04 Mar 2025 05:07:37 GMT", 90 * time.Second, true},
		{"literal RFC 850", "Tuesday, 04-Mar-25 05:07:37 GMT", 90 * time.Second, true},
		{"literal asctime", "Tue Mar  4 05:07:37 2025", 90 * time.Second, true},
		{"past date", now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"now", now.Format(http.TimeFormat), 0, true},
		{"huge", "99999999999999999999", time.Duration(math.MaxInt64), true},
		{"largest that fits", "9223372036", 9223372036 * time.Second, true},
		{"first that does not fit", "9223372037", time.Duration(math.MaxInt64), true},
		{"empty", "", 0, false},
		{"blank", "   ", 0, false},
		{"negative", "-1", 0, false},
		{"fraction", "1.5", 0, false},
		{"word", "abc", 0, false},
		{"plus sign", "+5", 0, false},
		{"number with unit", "5s", 0, false},
		{"two numbers", "1 2", 0, false},
		{"date in an unknown form", "2025-03-04T05:07:37Z", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.value, now)
			assert.Equal(t, tc.ok, ok, "%q", tc.value)
			assert.Equal(t, tc.want, got, "%q", tc.value)
		})
	}
}

// raUpstream answers the first request with status and a Retry-After
// header, then 200; it counts requests.
func raUpstream(status int, retryAfter string) (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After", retryAfter)
			w.WriteHeader(status)
			_, _ = w.Write([]byte("try later"))
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	return srv, &hits
}

func raTransport(t *testing.T, rec *evRecorder) *Transport {
	t.Helper()
	tr, err := NewTransport(&http.Transport{}, Options{
		Name:           "ra-test",
		Retry:          RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	return tr
}

func TestRetryAfterIgnoredOn500(t *testing.T) {
	srv, hits := raUpstream(http.StatusInternalServerError, "600")
	defer srv.Close()
	rec := &evRecorder{}
	tr := raTransport(t, rec)
	defer tr.CloseIdleConnections()

	status, err := cbGet(t, tr, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "a 500's Retry-After is not honoured: retried after the computed delay")
	assert.EqualValues(t, 2, hits.Load())
	retries := rec.of(EventRetry)
	require.Len(t, retries, 1)
	assert.Equal(t, time.Millisecond, retries[0].Delay)
	assert.Equal(t, http.StatusInternalServerError, retries[0].StatusCode)
}

func TestRetryAfterHonouredOn429And503(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Run("zero", func(t *testing.T) {
				srv, hits := raUpstream(code, "0")
				defer srv.Close()
				rec := &evRecorder{}
				tr := raTransport(t, rec)
				defer tr.CloseIdleConnections()

				status, err := cbGet(t, tr, srv.URL)
				require.NoError(t, err)
				assert.Equal(t, http.StatusOK, status)
				assert.EqualValues(t, 2, hits.Load())
				retries := rec.of(EventRetry)
				require.Len(t, retries, 1)
				assert.Zero(t, retries[0].Delay, "Retry-After: 0 replaces the computed 1ms")
			})
			t.Run("beyond the budget", func(t *testing.T) {
				srv, hits := raUpstream(code, "600") // past the 30s total timeout
				defer srv.Close()
				rec := &evRecorder{}
				tr := raTransport(t, rec)
				defer tr.CloseIdleConnections()

				req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
				require.NoError(t, err)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				assert.Less(t, time.Since(start), 5*time.Second, "not waited")
				assert.Equal(t, code, resp.StatusCode, "the server's answer, at once")
				assert.Equal(t, "600", resp.Header.Get("Retry-After"))
				body, err := evReadAll(resp)
				require.NoError(t, err)
				assert.Equal(t, "try later", body, "body intact")
				assert.EqualValues(t, 1, hits.Load())
				assert.Zero(t, rec.count(EventRetry))
			})
		})
	}
}

func TestRetryAfterIgnoreRetryAfter(t *testing.T) {
	srv, hits := raUpstream(http.StatusServiceUnavailable, "600")
	defer srv.Close()
	rec := &evRecorder{}
	tr, err := NewTransport(&http.Transport{}, Options{
		Retry:          RetryOptions{MaxRetries: 1, Delay: time.Millisecond, NoJitter: true, IgnoreRetryAfter: true},
		CircuitBreaker: CircuitBreakerOptions{Disabled: true},
		OnEvent:        rec.add,
	})
	require.NoError(t, err)
	defer tr.CloseIdleConnections()

	status, err := cbGet(t, tr, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.EqualValues(t, 2, hits.Load())
	retries := rec.of(EventRetry)
	require.Len(t, retries, 1)
	assert.Equal(t, time.Millisecond, retries[0].Delay)
}
