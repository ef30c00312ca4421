package headers

import (
	"net/http"
	"strings"
	"time"
)

// Reading the quota a server announces in its response headers. Three
// families are read, the first found wins:
//
//   - The IETF httpapi draft's structured fields (draft-ietf-httpapi-
//     ratelimit-headers-08 and later): RateLimit, a List of service limits
//     such as `"default";r=50;t=30` (r the quota left, t the seconds until
//     the window ends), and RateLimit-Policy, a List of policies such as
//     `"default";q=100;w=60` (q the quota, w the window's seconds, qu its
//     unit). When several service limits are listed, the one with the least
//     quota left binds (the longest t among those with none left).
//   - The earlier drafts: RateLimit as a Dictionary, `limit=100,
//     remaining=50, reset=5` (draft 07), and the separate RateLimit-Limit,
//     RateLimit-Remaining and RateLimit-Reset fields (drafts 00 to 06).
//   - The common X-RateLimit-Limit, X-RateLimit-Remaining and
//     X-RateLimit-Reset fields.
//
// What a quota is named by, and scoped to, is read too: the current
// draft's policy name (the binding service limit's), and the resource or
// partition its answer says the quota belongs to, if any: the draft's
// partition key (the pk parameter of the binding service limit, or of its
// policy) or, for the X- fields, X-RateLimit-Resource (GitHub's "core",
// "search", ...). A quota scoped so counts only the calls of that
// partition, not all the upstream's.
//
// A reset is delta seconds, as the drafts say, or a Unix time, as GitHub's
// X-RateLimit-Reset is: a value of 1e9 or more (more than 31 years as
// delta seconds, a date after 2001 as a Unix time) is read as Unix seconds,
// 1e12 or more as Unix milliseconds, and measured from the response's Date
// header when it has one, so that a skewed local clock does not move it. A
// decimal with up to three fractional digits (`t=0.25`) is read too, though
// the drafts send whole seconds.
//
// The fields are an upstream's bytes: a field longer than
// maxQuotaFieldLength, or an item past the first maxQuotaItems, is not
// read; a negative, non-numeric or malformed value makes its item (or
// field) ignored, as the draft asks; numbers saturate at 15 digits. The
// caller clamps the durations. Hand-written rather than a structured-field
// library: the root module takes no dependency for it, and reading the
// fields allocates nothing (ReadQuota, 0 allocs/op in
// BenchmarkReadQuota), while a general parser builds a value tree
// per response.

// Bounds on what is read of an upstream's quota fields.
const (
	maxQuotaFieldLength = 4 << 10 // bytes of one field value
	maxQuotaItems       = 16      // items of one field, and policies looked up
	maxQuotaDigits      = 15      // a structured-field integer's most digits

	// MaxQuotaName is the most bytes of a policy's or a resource's name
	// read: the rest is cut.
	MaxQuotaName = 64
)

// A Quota is what one response says of its upstream's quota.
type Quota struct {
	Remaining int64         // calls left in the window
	Reset     time.Duration // until the window ends, when HasReset
	HasReset  bool
	Limit     int64         // the window's quota, 0 if not said
	Window    time.Duration // the window's length, 0 if not said

	// Fields names the fields it was read from: "RateLimit" (the drafts'
	// forms) or "X-RateLimit".
	Fields string
	// Policy is the name of the current draft's policy that binds (such as
	// "default"), "" for the other forms.
	Policy string
	// Resource is the resource or partition the quota is scoped to: the
	// draft's partition key, or X-RateLimit-Resource. "" when the answer
	// names none: the quota counts every call.
	Resource string
}

// ReadQuota reads the quota h announces, received at now, and
// reports whether it announces one (a remaining count, at least).
func ReadQuota(h http.Header, now time.Time) (Quota, bool) {
	if v := h["Ratelimit"]; len(v) > 0 {
		if q, ok := readRateLimitList(v, h["Ratelimit-Policy"], h, now); ok {
			return q, true
		}
		if len(v) == 1 {
			if q, ok := readRateLimitDict(v[0], h, now); ok {
				return q, true
			}
		}
	}
	if v := h["Ratelimit-Remaining"]; len(v) > 0 {
		q, ok := readSeparateFields(v[0], h["Ratelimit-Reset"], h["Ratelimit-Limit"], h, now)
		q.Fields = "RateLimit"
		return q, ok
	}
	if v := h["X-Ratelimit-Remaining"]; len(v) > 0 {
		q, ok := readSeparateFields(v[0], h["X-Ratelimit-Reset"], h["X-Ratelimit-Limit"], h, now)
		q.Fields = "X-RateLimit"
		if r := h["X-Ratelimit-Resource"]; len(r) > 0 {
			q.Resource = quotaName(strings.Trim(r[0], " \t"))
		}
		return q, ok
	}
	return Quota{}, false
}

// quotaName is s, a name an upstream sent, cut to MaxQuotaName bytes.
func quotaName(s string) string {
	if len(s) > MaxQuotaName {
		return s[:MaxQuotaName]
	}
	return s
}

// partitionKey returns the partition key a pk parameter of value v names:
// the draft asks for a Byte Sequence (its base64 text is the key), and a
// String, Token or Integer is read as well, as naming a partition all the
// same.
func partitionKey(v sfValue) (string, bool) {
	if v.text == "" || v.text == "?1" {
		return "", false // a Boolean: no key
	}
	return quotaName(v.text), true
}

// readSeparateFields reads the Remaining, Reset and Limit fields of the
// early drafts and of the X- forms.
func readSeparateFields(remaining string, reset, limit []string, h http.Header, now time.Time) (Quota, bool) {
	var q Quota
	r, ok := wholeNumber(remaining)
	if !ok {
		return q, false
	}
	q.Remaining = r / 1000
	if len(reset) > 0 {
		if t, ok := wholeNumber(reset[0]); ok {
			q.Reset, q.HasReset = resetDuration(t, h, now), true
		}
	}
	if len(limit) > 0 {
		// Draft 03 allowed "100, 100;w=10": the first number is the limit.
		s := limit[0]
		for i := 0; i < len(s) && i < maxQuotaFieldLength; i++ {
			if s[i] == ',' || s[i] == ';' {
				s = s[:i]
				break
			}
		}
		if l, ok := wholeNumber(s); ok {
			q.Limit = l / 1000
		}
	}
	return q, true
}

// wholeNumber reads a field that is one non-negative number, in
// thousandths.
func wholeNumber(s string) (int64, bool) {
	if len(s) > maxQuotaFieldLength {
		return 0, false
	}
	p := sfParser{s: s}
	p.skipOWS()
	n, ok := p.number()
	p.skipOWS()
	return n, ok && n >= 0 && p.done()
}

// resetDuration turns a reset value in thousandths of a second, delta or
// Unix time (see above), into the wait from now, at most MaxQuotaWait.
func resetDuration(v int64, h http.Header, now time.Time) time.Duration {
	const unixSeconds, unixMillis = 1e9 * 1000, 1e12 * 1000
	if v < unixSeconds {
		return time.Duration(min(v, MaxQuotaWait.Milliseconds())) * time.Millisecond
	}
	ms := v // Unix seconds in thousandths: Unix milliseconds
	if v >= unixMillis {
		ms = v / 1000
	}
	ref := now
	if d := h["Date"]; len(d) > 0 && len(d[0]) < 64 {
		if t, err := http.ParseTime(d[0]); err == nil {
			ref = t
		}
	}
	if refMs := ref.UnixMilli(); ms > refMs {
		return time.Duration(min(ms-refMs, MaxQuotaWait.Milliseconds())) * time.Millisecond
	}
	return 0
}

// MaxQuotaWait is longer than any wait a caller keeps: the durations
// ReadQuota returns are clamped to it, so that no arithmetic on them
// overflows.
const MaxQuotaWait = 1000 * time.Hour

// readRateLimitList reads the current draft's RateLimit List, with the
// RateLimit-Policy List for the binding limit's quota and window.
func readRateLimitList(fields, policies []string, h http.Header, now time.Time) (Quota, bool) {
	var best Quota
	var bestName string
	found, items := false, 0
	for _, f := range fields {
		if len(f) > maxQuotaFieldLength {
			return Quota{}, false
		}
		p := sfParser{s: f}
		for !p.done() && items < maxQuotaItems {
			items++
			name, params, ok := p.listItem()
			if !ok {
				return Quota{}, false // malformed: the field is ignored
			}
			var q Quota
			hasR := false
			for k, v, more := params.next(); more; k, v, more = params.next() {
				if k == "pk" {
					q.Resource, _ = partitionKey(v)
					continue
				}
				if !v.isNum || v.num < 0 {
					continue // r and t are non-negative numbers
				}
				switch k {
				case "r":
					q.Remaining, hasR = v.num/1000, true
				case "t":
					q.Reset, q.HasReset = resetDuration(v.num, h, now), true
				}
			}
			if !hasR {
				continue // r is required
			}
			if !found || q.Remaining < best.Remaining ||
				(q.Remaining == best.Remaining && q.HasReset && (!best.HasReset || q.Reset > best.Reset)) {
				best, bestName, found = q, name, true
			}
		}
	}
	if !found {
		return Quota{}, false
	}
	best.Fields, best.Policy = "RateLimit", quotaName(bestName)
	if pol, ok := findPolicy(policies, bestName); ok {
		if !pol.requests {
			return Quota{}, false // a quota of bytes, not of calls
		}
		best.Limit, best.Window = pol.quota, pol.window
		if best.Resource == "" {
			best.Resource = pol.partition
		}
		if !best.HasReset && pol.window > 0 {
			// No t: the window's length bounds the wait for its end.
			best.Reset, best.HasReset = pol.window, true
		}
	}
	return best, true
}

// A quotaPolicy is one item of RateLimit-Policy.
type quotaPolicy struct {
	quota     int64
	window    time.Duration
	requests  bool   // its unit is requests (qu absent or "requests")
	partition string // its partition key (pk), if any
}

// findPolicy looks up the policy named name in the RateLimit-Policy fields.
func findPolicy(fields []string, name string) (quotaPolicy, bool) {
	items := 0
	for _, f := range fields {
		if len(f) > maxQuotaFieldLength {
			return quotaPolicy{}, false
		}
		p := sfParser{s: f}
		for !p.done() && items < maxQuotaItems {
			items++
			n, params, ok := p.listItem()
			if !ok {
				return quotaPolicy{}, false
			}
			if n != name {
				continue
			}
			pol := quotaPolicy{requests: true}
			for k, v, more := params.next(); more; k, v, more = params.next() {
				switch {
				case k == "qu":
					pol.requests = v.text == "requests" && !v.isBytes
				case k == "pk":
					pol.partition, _ = partitionKey(v)
				case !v.isNum || v.num < 0:
				case k == "q":
					pol.quota = v.num / 1000
				case k == "w":
					pol.window = time.Duration(min(v.num, MaxQuotaWait.Milliseconds())) * time.Millisecond
				}
			}
			return pol, true
		}
	}
	return quotaPolicy{}, false
}

// readRateLimitDict reads draft 07's RateLimit Dictionary:
// limit=100, remaining=50, reset=5.
func readRateLimitDict(f string, h http.Header, now time.Time) (Quota, bool) {
	if len(f) > maxQuotaFieldLength {
		return Quota{}, false
	}
	q := Quota{Fields: "RateLimit"}
	hasR := false
	p := sfParser{s: f}
	for members := 0; !p.done() && members < maxQuotaItems; members++ {
		key, v, ok := p.dictMember()
		if !ok {
			return Quota{}, false
		}
		if v < 0 {
			continue
		}
		switch key {
		case "limit":
			q.Limit = v / 1000
		case "remaining":
			q.Remaining, hasR = v/1000, true
		case "reset":
			q.Reset, q.HasReset = resetDuration(v, h, now), true
		}
	}
	return q, hasR
}

// ScanQuota reports, in one pass over h's names, what HasQuota reports
// (has), and whether h names a field that ReadQuota reads in another
// spelling than the canonical one, as a base RoundTripper other than
// net/http's may ("ratelimit"): then has is not to be trusted, and h needs
// CanonicalClone. It compares only names of the lengths of those fields,
// and allocates nothing: a base other than net/http's pays one pass where
// it paid a pass and HasQuota's three lookups.
func ScanQuota(h http.Header) (has, otherwise bool) {
	for k, v := range h {
		var a, b string // the fields of k's length
		quota := false  // a is one HasQuota looks for
		switch len(k) {
		case len("Date"):
			a = "Date"
		case len("Ratelimit"):
			a, quota = "Ratelimit", true
		case len("Ratelimit-Reset"):
			a, b = "Ratelimit-Reset", "Ratelimit-Limit"
		case len("Ratelimit-Policy"):
			a = "Ratelimit-Policy"
		case len("X-Ratelimit-Reset"):
			a, b = "X-Ratelimit-Reset", "X-Ratelimit-Limit"
		case len("Ratelimit-Remaining"):
			a, quota = "Ratelimit-Remaining", true
		case len("X-Ratelimit-Resource"):
			a = "X-Ratelimit-Resource"
		case len("X-Ratelimit-Remaining"):
			a, quota = "X-Ratelimit-Remaining", true
		default:
			continue
		}
		switch {
		case k == a:
			has = has || (quota && len(v) > 0)
		case k == b:
		case strings.EqualFold(k, a) || (b != "" && strings.EqualFold(k, b)):
			return has, true
		}
	}
	return has, false
}

// HasQuota reports whether h may announce a quota, in the canonical
// spelling of its fields.
func HasQuota(h http.Header) bool {
	return len(h["Ratelimit"]) > 0 || len(h["Ratelimit-Remaining"]) > 0 || len(h["X-Ratelimit-Remaining"]) > 0
}
