package resilience

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Item 2: an answer served from a cache says nothing of the quota now: it
// starts no refusal, whether its age says so (Age, RFC 9111 section 5.1)
// or gregjones/httpcache's X-From-Cache does; a fresh answer with the same
// figures does, as before.
func TestServerQuotaIgnoresCachedAnswers(t *testing.T) {
	old := time.Now().Add(-50 * time.Minute).Truncate(time.Second)
	for _, tc := range []struct {
		name    string
		header  http.Header
		refused bool
	}{
		{"Age 3000 on a Date 50 minutes old", http.Header{
			"Date":                  {old.UTC().Format(http.TimeFormat)},
			"Age":                   {"3000"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {strconv.FormatInt(old.Add(time.Minute).Unix(), 10)},
		}, false},
		{"X-From-Cache", http.Header{
			"X-From-Cache":          {"1"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
		}, false},
		{"X-From-Cache on a 429 with Retry-After", http.Header{
			"X-From-Cache": {"1"},
			"Retry-After":  {"60"},
			"Ratelimit":    {`"default";r=0;t=60`},
		}, false},
		{"Age with a delta reset", http.Header{
			"Age":       {"5"},
			"Ratelimit": {`"default";r=0;t=60`},
		}, false},
		{"fresh: Age 0", http.Header{
			"Age":                   {"0"},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status := http.StatusOK
			if tc.header.Get("Retry-After") != "" {
				status = http.StatusTooManyRequests
			}
			up := sqNewStatusUpstream(tc.header, status)
			defer up.Close()
			opts := sqOptions(&evRecorder{}, RateLimitOptions{})
			opts.Retry.Disabled = true
			_, tr := sqTransport(t, opts)

			_, err := sqGet(context.Background(), tr, up.URL)
			require.NoError(t, err)
			_, err = sqGet(context.Background(), tr, up.URL)
			if tc.refused {
				require.ErrorIs(t, err, ErrRateLimited, "a fresh answer's spent quota is followed")
				assert.EqualValues(t, 1, up.hits.Load())
				return
			}
			require.NoError(t, err, "an answer from a cache starts no refusal")
			assert.EqualValues(t, 2, up.hits.Load())
		})
	}
}
