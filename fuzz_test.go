package resilience

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{
		"0", "120", " 5 ", "-1", "1.5", "+5", "", "99999999999999999999",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		"Thu, 01 Jan 2099 00:00:00 GMT", "soon",
	} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if !ok {
			if d != 0 {
				t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 when invalid", v, d)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v; want a wait of zero or more", v, d)
		}
		s := strings.TrimSpace(v)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && s[0] != '+' && s[0] != '-' && n < int64(time.Duration(1<<63-1)/time.Second) {
			if d != time.Duration(n)*time.Second {
				t.Fatalf("ParseRetryAfter(%q) = %v; want %ds", v, d, n)
			}
		}
		// What the parser accepts, it also reads back from its own canonical form.
		if d < 1000*time.Hour {
			back, ok := ParseRetryAfter(now.Add(d).UTC().Format(http.TimeFormat), now)
			if !ok || back > d || d-back >= time.Second {
				t.Fatalf("ParseRetryAfter(%q) = %v, but its HTTP-date reads back as %v, %v", v, d, back, ok)
			}
		}
	})
}

func FuzzOptions(f *testing.F) {
	f.Add(0.0, 0, 0, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), 0, 0.0, 0, "", "")
	f.Add(0.5, 10, 2, int64(time.Second), int64(5*time.Second), int64(time.Millisecond), int64(time.Second), int64(30*time.Second), int64(5*time.Second), 1, 10.0, 5, "PUT", "GET")
	f.Add(1.5, -1, -3, int64(-1), int64(-1), int64(-1), int64(-5), int64(-1), int64(-1), 7, -1.0, -1, "post", "PURGE")
	f.Fuzz(func(t *testing.T, ratio float64, throughput, retries int, attempt, total, delay, maxDelay, sampling, brk int64, backoffType int, rps float64, burst int, method, exclude string) {
		o := Options{
			Name:           "fuzz",
			AttemptTimeout: time.Duration(attempt),
			TotalTimeout:   time.Duration(total),
			RateLimit:      RateLimitOptions{RequestsPerSecond: rps, Burst: burst, MaxConcurrent: throughput, MaxQueue: retries},
			Retry: RetryOptions{
				MaxRetries: retries, Delay: time.Duration(delay), MaxDelay: time.Duration(maxDelay),
				Backoff: BackoffType(backoffType),
			},
			CircuitBreaker: CircuitBreakerOptions{
				FailureRatio: ratio, MinimumThroughput: throughput,
				SamplingDuration: time.Duration(sampling), BreakDuration: time.Duration(brk),
			},
		}
		if method != "" {
			o.Retry.Methods = []string{method}
		}
		if exclude != "" {
			o.Retry.ExcludeMethods = []string{exclude}
		}
		h, err := NewHandler(o) // must never panic
		if err != nil {
			if !strings.HasPrefix(err.Error(), `resilience: handler "fuzz": invalid option `) {
				t.Fatalf("error %q does not name the handler and the option", err)
			}
			return
		}
		c := h.cfg.Load()
		switch {
		case !(c.CircuitBreaker.FailureRatio > 0 && c.CircuitBreaker.FailureRatio <= 1):
			t.Fatalf("accepted FailureRatio %v", c.CircuitBreaker.FailureRatio)
		case c.CircuitBreaker.MinimumThroughput <= 0, c.RateLimit.MaxConcurrent <= 0, c.RateLimit.MaxQueue < 0:
			t.Fatalf("accepted counts %+v %+v", c.CircuitBreaker, c.RateLimit)
		case c.Retry.MaxRetries <= 0, c.Retry.Delay == 0, c.Retry.MaxDelay <= 0, c.Retry.MaxDelay < c.Retry.Delay:
			t.Fatalf("accepted retry %+v", c.Retry)
		case c.TotalTimeout > 0 && c.AttemptTimeout > c.TotalTimeout:
			t.Fatalf("accepted attempt %v above total %v", c.AttemptTimeout, c.TotalTimeout)
		case c.CircuitBreaker.SamplingDuration < 2*c.AttemptTimeout:
			t.Fatalf("accepted sampling %v under twice attempt %v", c.CircuitBreaker.SamplingDuration, c.AttemptTimeout)
		case c.CircuitBreaker.BreakDuration <= 0:
			t.Fatalf("accepted break %v", c.CircuitBreaker.BreakDuration)
		}
		if method != "" && !c.methods.allows(method) && method != exclude {
			t.Fatalf("accepted method %q but does not retry it", method)
		}
	})
}
