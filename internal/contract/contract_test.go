package contract

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The hostile values every parser is tried with, beside its own cases.
var (
	huge      = strings.Repeat("7", 100<<10)        // a 100 KiB value
	tenTo30   = "1" + strings.Repeat("0", 30)       // 10^30 written out: 31 digits
	twentyDig = "18446744073709551616"              // 2^64: 20 digits, one too many
	maxDigits = strings.Repeat("9", MaxValueLength) // 19 nines: above int64's range, still read
)

func one(s string) []string { return []string{s} }

func TestParseBudget(t *testing.T) {
	for _, c := range []struct {
		name   string
		values []string
		want   time.Duration
		ok     bool
	}{
		{"absent", nil, 0, false},
		{"no value", []string{}, 0, false},
		{"empty", one(""), 0, false},
		{"zero: spent", one("0"), 0, true},
		{"one ms", one("1"), time.Millisecond, true},
		{"250 ms", one("250"), 250 * time.Millisecond, true},
		{"leading zeros", one("0005"), 5 * time.Millisecond, true},
		{"MaxBudget exactly", one("86400000"), MaxBudget, true},
		{"above MaxBudget: clamped", one("86400001"), MaxBudget, true},
		{"19 nines: clamped", one(maxDigits), MaxBudget, true},
		{"negative", one("-5"), 0, false},
		{"exponent", one("1e30"), 0, false},
		{"10^30 in 31 digits: too long", one(tenTo30), 0, false},
		{"2^64 in 20 digits: too long", one(twentyDig), 0, false},
		{"letters", one("abc"), 0, false},
		{"leading space", one(" 5"), 0, false},
		{"trailing space", one("5 "), 0, false},
		{"plus sign", one("+5"), 0, false},
		{"decimal point", one("5.5"), 0, false},
		{"list in one field", one("5, 6"), 0, false},
		{"two values", []string{"5", "6"}, 0, false},
		{"two equal values", []string{"5", "5"}, 0, false},
		{"100 KiB", one(huge), 0, false},
		{"non-ASCII digit", one("５"), 0, false},
		{"NUL", one("5\x00"), 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ParseBudget(c.values)
			assert.Equal(t, c.ok, ok)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestFormatBudget(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{-time.Second, "0"},
		{999 * time.Microsecond, "0"},
		{time.Millisecond, "1"},
		{1999 * time.Microsecond, "1"},
		{30 * time.Second, "30000"},
		{time.Duration(1<<63 - 1), "9223372036854"},
	} {
		assert.Equal(t, c.want, FormatBudget(c.d), "%v", c.d)
	}
	// What is written is read back, rounded down and clamped.
	for _, d := range []time.Duration{0, time.Millisecond, 1234567 * time.Microsecond, 48 * time.Hour} {
		got, ok := ParseBudget(one(FormatBudget(d)))
		assert.True(t, ok)
		assert.Equal(t, min(d.Truncate(time.Millisecond), MaxBudget), got)
	}
}

func TestParseAttempt(t *testing.T) {
	for _, c := range []struct {
		name   string
		values []string
		want   int
		ok     bool
	}{
		{"absent", nil, 0, false},
		{"empty", one(""), 0, false},
		{"first", one("1"), 1, true},
		{"a retry", one("2"), 2, true},
		{"MaxAttempt", one("1000"), MaxAttempt, true},
		{"leading zeros", one("0003"), 3, true},
		{"zero", one("0"), 0, false},
		{"above MaxAttempt", one("1001"), 0, false},
		{"19 nines", one(maxDigits), 0, false},
		{"negative", one("-5"), 0, false},
		{"exponent", one("1e30"), 0, false},
		{"10^30 in 31 digits", one(tenTo30), 0, false},
		{"letters", one("abc"), 0, false},
		{"leading space", one(" 5"), 0, false},
		{"trailing space", one("5 "), 0, false},
		{"plus sign", one("+5"), 0, false},
		{"two values", []string{"2", "3"}, 0, false},
		{"100 KiB", one(huge), 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ParseAttempt(c.values)
			assert.Equal(t, c.ok, ok)
			assert.Equal(t, c.want, got)
		})
	}
	assert.Equal(t, "1", FormatAttempt(0))
	assert.Equal(t, "1", FormatAttempt(-3))
	assert.Equal(t, "4", FormatAttempt(4))
	assert.Equal(t, "1000", FormatAttempt(1<<40))
}

func TestParsePushback(t *testing.T) {
	for _, c := range []struct {
		name   string
		values []string
		wait   time.Duration
		stop   bool
		ok     bool
	}{
		{"absent", nil, 0, false, false},
		{"empty", one(""), 0, false, false},
		{"zero: retry at once", one("0"), 0, false, true},
		{"a wait", one("250"), 250 * time.Millisecond, false, true},
		{"a wait above MaxBudget: clamped", one(maxDigits), MaxBudget, false, true},
		{"stop", one(PushbackStop), 0, true, true},
		{"any negative: stop", one("-5"), 0, true, true},
		{"negative 19 digits: stop", one("-" + maxDigits), 0, true, true},
		{"a bare minus", one("-"), 0, false, false},
		{"negative, too long", one("-" + tenTo30), 0, false, false},
		{"minus letters", one("-abc"), 0, false, false},
		{"double minus", one("--1"), 0, false, false},
		{"exponent", one("1e30"), 0, false, false},
		{"10^30 in 31 digits", one(tenTo30), 0, false, false},
		{"letters", one("abc"), 0, false, false},
		{"leading space", one(" 5"), 0, false, false},
		{"trailing space", one("5 "), 0, false, false},
		{"plus sign", one("+5"), 0, false, false},
		{"two values", []string{"-1", "-1"}, 0, false, false},
		{"100 KiB", one(huge), 0, false, false},
		{"100 KiB negative", one("-" + huge), 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			wait, stop, ok := ParsePushback(c.values)
			assert.Equal(t, c.ok, ok, "ok")
			assert.Equal(t, c.stop, stop, "stop")
			assert.Equal(t, c.wait, wait, "wait")
		})
	}
	assert.Equal(t, "0", FormatPushback(-time.Second))
	assert.Equal(t, "1500", FormatPushback(1500*time.Millisecond))
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "0", "5", "-1", "+5", " 5", "1e30", tenTo30, maxDigits, "-" + maxDigits} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := ParseBudget(one(s)); ok && (d < 0 || d > MaxBudget) {
			t.Fatalf("ParseBudget(%q) = %v, outside [0, MaxBudget]", s, d)
		}
		if n, ok := ParseAttempt(one(s)); ok && (n < 1 || n > MaxAttempt) {
			t.Fatalf("ParseAttempt(%q) = %d, outside [1, MaxAttempt]", s, n)
		}
		if wait, stop, ok := ParsePushback(one(s)); ok && (wait < 0 || wait > MaxBudget || (stop && wait != 0)) {
			t.Fatalf("ParsePushback(%q) = %v, %v", s, wait, stop)
		}
	})
}
