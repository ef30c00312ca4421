package headers

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestReadQuota(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	epoch := now.Unix()
	type want = Quota
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   Quota
		ok     bool
	}{
		{"none", map[string]string{"Content-Type": "text/plain"}, want{}, false},
		{"policy alone is informative", map[string]string{"RateLimit-Policy": `"default";q=100;w=60`}, want{}, false},

		// The current draft's structured fields.
		{"draft: RateLimit alone", map[string]string{"RateLimit": `"default";r=50;t=30`},
			want{Remaining: 50, Reset: 30 * time.Second, HasReset: true}, true},
		{"draft: with its policy", map[string]string{"RateLimit": `"default";r=0;t=7`, "RateLimit-Policy": `"default";q=100;w=60`},
			want{Remaining: 0, Reset: 7 * time.Second, HasReset: true, Limit: 100, Window: time.Minute}, true},
		{"draft: token name, OWS, extra params", map[string]string{"RateLimit": `  default;r=5;t=2;acme-x="y";pk=:cHsdsRa894==:  `},
			want{Remaining: 5, Reset: 2 * time.Second, HasReset: true}, true},
		{"draft: the binding limit of several", map[string]string{
			"RateLimit":        `"permin";r=20;t=40, "perhr";r=3;t=1800, "daily";r=900;t=80000`,
			"RateLimit-Policy": `"permin";q=50;w=60,"perhr";q=1000;w=3600`},
			want{Remaining: 3, Reset: 1800 * time.Second, HasReset: true, Limit: 1000, Window: time.Hour}, true},
		{"draft: of several spent, the longest reset", map[string]string{"RateLimit": `"a";r=0;t=5, "b";r=0;t=9, "c";r=1;t=1`},
			want{Remaining: 0, Reset: 9 * time.Second, HasReset: true}, true},
		{"draft: no t, the policy's window bounds the wait", map[string]string{"RateLimit": `"d";r=0`, "RateLimit-Policy": `"d";q=10;w=20`},
			want{Remaining: 0, Reset: 20 * time.Second, HasReset: true, Limit: 10, Window: 20 * time.Second}, true},
		{"draft: no t, no window", map[string]string{"RateLimit": `"d";r=4`}, want{Remaining: 4}, true},
		{"draft: decimal t", map[string]string{"RateLimit": `"d";r=1;t=0.25`},
			want{Remaining: 1, Reset: 250 * time.Millisecond, HasReset: true}, true},
		{"draft: a quota of bytes is not of calls", map[string]string{"RateLimit": `"b";r=0;t=10`, "RateLimit-Policy": `"b";q=65535;qu="content-bytes";w=10`}, want{}, false},
		{"draft: no r", map[string]string{"RateLimit": `"d";t=10`}, want{}, false},
		{"draft: negative r ignores the item", map[string]string{"RateLimit": `"d";r=-1;t=10`}, want{}, false},
		{"draft: negative t is no reset", map[string]string{"RateLimit": `"d";r=0;t=-5`}, want{Remaining: 0}, true},
		{"draft: malformed", map[string]string{"RateLimit": `"d";r=0;t=10,`}, want{}, false},
		{"draft: unterminated string", map[string]string{"RateLimit": `"d;r=0;t=10`}, want{}, false},
		{"draft: inner list", map[string]string{"RateLimit": `("d");r=0`}, want{}, false},
		{"draft: huge r saturates", map[string]string{"RateLimit": `"d";r=99999999999999999999999;t=1`},
			want{Remaining: 1e15, Reset: time.Second, HasReset: true}, true},
		{"draft: huge t is clamped", map[string]string{"RateLimit": `"d";r=0;t=999999999`},
			want{Remaining: 0, Reset: MaxQuotaWait, HasReset: true}, true},

		// Draft 07's Dictionary.
		{"draft 07", map[string]string{"RateLimit": `limit=100, remaining=50, reset=5`},
			want{Remaining: 50, Reset: 5 * time.Second, HasReset: true, Limit: 100}, true},
		{"draft 07: no remaining", map[string]string{"RateLimit": `limit=100, reset=5`}, want{}, false},
		{"draft 07: non-numeric", map[string]string{"RateLimit": `limit=100, remaining=lots, reset=5`},
			want{Limit: 100, Reset: 5 * time.Second, HasReset: true}, false},

		// Drafts 00 to 06.
		{"draft 06", map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "12"},
			want{Remaining: 0, Reset: 12 * time.Second, HasReset: true, Limit: 100}, true},
		{"draft 03 limit with its policy", map[string]string{"RateLimit-Limit": "100, 100;w=10", "RateLimit-Remaining": "7", "RateLimit-Reset": "3"},
			want{Remaining: 7, Reset: 3 * time.Second, HasReset: true, Limit: 100}, true},

		// The X- forms.
		{"x: delta reset", map[string]string{"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "42"},
			want{Remaining: 0, Reset: 42 * time.Second, HasReset: true, Limit: 60}, true},
		{"x: Unix reset (GitHub)", map[string]string{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": itoa(epoch + 90)},
			want{Remaining: 0, Reset: 90 * time.Second, HasReset: true, Limit: 5000}, true},
		{"x: Unix reset measured from Date", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": itoa(epoch + 90),
			"Date": now.Add(-time.Hour).Format(http.TimeFormat)}, // the server's clock is an hour behind ours
			want{Remaining: 0, Reset: time.Hour + 90*time.Second, HasReset: true}, true},
		{"x: Unix milliseconds", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": itoa(epoch*1000 + 1500)},
			want{Remaining: 0, Reset: 1500 * time.Millisecond, HasReset: true}, true},
		{"x: Unix reset in the past", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": itoa(epoch - 10)},
			want{Remaining: 0, Reset: 0, HasReset: true}, true},
		{"x: negative remaining", map[string]string{"X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "5"}, want{}, false},
		{"x: non-numeric reset", map[string]string{"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "soon"}, want{Remaining: 3}, true},
		{"x: too long", map[string]string{"X-RateLimit-Remaining": strings.Repeat("1", maxQuotaFieldLength+1)}, want{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			got, ok := ReadQuota(h, now)
			assert.Equal(t, tc.ok, ok)
			if ok {
				got.Fields, got.Policy, got.Resource = "", "", "" // TestReadQuotaNames's
				assert.Equal(t, tc.want, got)
			}
		})
	}
}

// What names a quota, and what it is scoped to.
func TestReadQuotaNames(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	long := strings.Repeat("n", MaxQuotaName+10)
	for _, tc := range []struct {
		name                     string
		header                   map[string]string
		fields, policy, resource string
	}{
		{"draft", map[string]string{"RateLimit": `"default";r=5;t=2`}, "RateLimit", "default", ""},
		{"draft: a token name", map[string]string{"RateLimit": `burst;r=5`}, "RateLimit", "burst", ""},
		{"draft: the binding limit's name", map[string]string{"RateLimit": `"a";r=5, "b";r=1`}, "RateLimit", "b", ""},
		{"draft: pk on the service limit", map[string]string{"RateLimit": `"peruser";r=0;t=60;pk=:dXNlcjE=:`}, "RateLimit", "peruser", "dXNlcjE="},
		{"draft: pk of the binding limit only", map[string]string{"RateLimit": `"a";r=5;pk=:YQ==:, "b";r=1`}, "RateLimit", "b", ""},
		{"draft: pk on its policy", map[string]string{"RateLimit": `"peruser";r=0;t=60`, "RateLimit-Policy": `"peruser";q=100;w=60;pk=:cHsdsRa894==:`},
			"RateLimit", "peruser", "cHsdsRa894=="},
		{"draft: the service limit's pk wins", map[string]string{"RateLimit": `"p";r=0;pk=:YQ==:`, "RateLimit-Policy": `"p";q=1;pk=:Yg==:`}, "RateLimit", "p", "YQ=="},
		{"draft: a String pk", map[string]string{"RateLimit": `"p";r=0;pk="search"`}, "RateLimit", "p", "search"},
		{"draft: a Boolean pk is none", map[string]string{"RateLimit": `"p";r=0;pk`}, "RateLimit", "p", ""},
		{"draft: names are cut", map[string]string{"RateLimit": `"` + long + `";r=0;pk="` + long + `"`}, "RateLimit", long[:MaxQuotaName], long[:MaxQuotaName]},
		{"draft 07", map[string]string{"RateLimit": `limit=100, remaining=50, reset=5`}, "RateLimit", "", ""},
		{"draft 06", map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "12"}, "RateLimit", "", ""},
		{"x", map[string]string{"X-RateLimit-Remaining": "0"}, "X-RateLimit", "", ""},
		{"x: GitHub's resource", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Resource": " search "}, "X-RateLimit", "", "search"},
		{"x: a long resource is cut", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Resource": long}, "X-RateLimit", "", long[:MaxQuotaName]},
		{"x: the resource scopes the X- fields only", map[string]string{"RateLimit": `"d";r=0`, "X-RateLimit-Resource": "search"}, "RateLimit", "d", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			got, ok := ReadQuota(h, now)
			assert.True(t, ok)
			assert.Equal(t, tc.fields, got.Fields)
			assert.Equal(t, tc.policy, got.Policy)
			assert.Equal(t, tc.resource, got.Resource)
		})
	}
}

func TestReadQuotaBounded(t *testing.T) {
	now := time.Now()
	// Thousands of policies: only the first maxQuotaItems are read.
	var b strings.Builder
	for i := 0; i < 5000; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"p";r=9;t=1`)
	}
	h := http.Header{"Ratelimit": {`"p";r=3;t=1,` + b.String()[:maxQuotaFieldLength-20]}}
	got, ok := ReadQuota(h, now)
	assert.True(t, ok)
	assert.EqualValues(t, 3, got.Remaining)

	h = http.Header{"Ratelimit": {b.String()}} // longer than maxQuotaFieldLength: not read
	_, ok = ReadQuota(h, now)
	assert.False(t, ok)

	// The binding limit hides past the items read: it is not seen.
	items := strings.Repeat(`"p";r=9;t=1,`, maxQuotaItems)
	h = http.Header{"Ratelimit": {items + `"q";r=0;t=50`}}
	got, ok = ReadQuota(h, now)
	assert.True(t, ok)
	assert.EqualValues(t, 9, got.Remaining)
}

func TestReadQuotaAllocatesNothing(t *testing.T) {
	now := time.Now()
	for _, h := range []http.Header{
		{"Content-Type": {"text/plain"}},
		{"Ratelimit": {`"default";r=50;t=30`}, "Ratelimit-Policy": {`"default";q=100;w=60`}},
		{"Ratelimit": {`limit=100, remaining=50, reset=5`}},
		{"X-Ratelimit-Limit": {"60"}, "X-Ratelimit-Remaining": {"10"}, "X-Ratelimit-Reset": {"42"}},
		{"X-Ratelimit-Remaining": {"10"}, "X-Ratelimit-Reset": {"42"}, "X-Ratelimit-Resource": {"search"}},
		{"Ratelimit": {`"peruser";r=0;t=60;pk=:dXNlcjE=:`}, "Ratelimit-Policy": {`"peruser";q=100;w=60;pk=:dXNlcjE=:`}},
	} {
		allocs := testing.AllocsPerRun(100, func() { ReadQuota(h, now) })
		assert.Zero(t, allocs, "%v", h)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func BenchmarkReadQuota(b *testing.B) {
	now := time.Now()
	b.Run("none", func(b *testing.B) {
		h := http.Header{"Content-Type": {"text/plain"}, "Content-Length": {"80"}}
		b.ReportAllocs()
		for b.Loop() {
			ReadQuota(h, now)
		}
	})
	b.Run("draft", func(b *testing.B) {
		h := http.Header{"Ratelimit": {`"default";r=50;t=30`}, "Ratelimit-Policy": {`"default";q=100;w=60`}}
		b.ReportAllocs()
		for b.Loop() {
			ReadQuota(h, now)
		}
	})
}

func FuzzReadQuota(f *testing.F) {
	for _, s := range []string{
		`"default";r=50;t=30`, `"d";r=0;t=0.25`, `limit=100, remaining=50, reset=5`, `default;r=5;pk=:cHsdsRa894==:`,
		`"a";r=0;t=5, "b";r=0;t=9`, `"d";r=-1`, `"d";r=99999999999999999999`, `("x");r=1`, `?1;r=2;t=3`, "", "1700000000",
	} {
		f.Add(s, `"default";q=100;w=60`, s)
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, rateLimit, policy, x string) {
		for _, h := range []http.Header{
			{"Ratelimit": {rateLimit}, "Ratelimit-Policy": {policy}},
			{"Ratelimit-Remaining": {x}, "Ratelimit-Reset": {rateLimit}, "Ratelimit-Limit": {policy}},
			{"X-Ratelimit-Remaining": {x}, "X-Ratelimit-Reset": {x}, "Date": {policy}},
		} {
			q, ok := ReadQuota(h, now) // must never panic
			if !ok {
				continue
			}
			switch {
			case q.Remaining < 0, q.Limit < 0:
				t.Fatalf("%v: negative count %+v", h, q)
			case q.Reset < 0 || q.Reset > MaxQuotaWait, q.Window < 0 || q.Window > MaxQuotaWait:
				t.Fatalf("%v: duration out of [0, %v]: %+v", h, MaxQuotaWait, q)
			case !q.HasReset && q.Reset != 0:
				t.Fatalf("%v: a reset without HasReset: %+v", h, q)
			}
		}
	})
}

func TestScanQuota(t *testing.T) {
	for _, k := range []string{"ratelimit", "RateLimit", "ratelimit-policy", "RateLimit-Reset", "ratelimit-limit", "ratelimit-remaining", "x-ratelimit-remaining", "X-RateLimit-Reset", "x-ratelimit-limit", "x-ratelimit-resource", "date"} {
		_, otherwise := ScanQuota(http.Header{"Content-Type": {"x"}, k: {"1"}})
		assert.True(t, otherwise, k)
	}
	h := http.Header{"Content-Type": {"x"}, "Ratelimit": {"a"}, "X-Ratelimit-Reset": {"1"}, "Date": {"d"}, "Vary": {"v"}, "etag": {"e"}}
	has, otherwise := ScanQuota(h)
	assert.False(t, otherwise, "canonical, or not a quota field")
	assert.True(t, has)
	assert.Zero(t, testing.AllocsPerRun(100, func() { ScanQuota(h) }))

	// Over canonical names, has is HasQuota, field by field.
	for _, k := range []string{"Ratelimit", "Ratelimit-Remaining", "X-Ratelimit-Remaining", "Ratelimit-Policy", "Ratelimit-Reset", "Ratelimit-Limit", "X-Ratelimit-Reset", "X-Ratelimit-Limit", "Date", "Content-Type"} {
		for _, v := range [][]string{{"1"}, {}} {
			h := http.Header{"Vary": {"v"}, k: v}
			has, otherwise := ScanQuota(h)
			assert.False(t, otherwise, k)
			assert.Equal(t, HasQuota(h), has, "%s: %q", k, v)
		}
	}
}
