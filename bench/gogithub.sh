#!/usr/bin/env bash
# The go-github method (issue 29): run go-github's own test suite with the
# Transport of its test client wrapped by resilience.NewTransport, built
# against this checkout, and count what passes and fails. Code nobody on
# this project wrote, with its own expectations of an http.RoundTripper
# (headers, bodies, errors, rate-limit handling), is the test of the
# library's transparency.
#
#   bench/gogithub.sh                        # go-github v84 @latest, ~2-4 min on 2 cores
#   GOGITHUB_VERSION=v84.0.0 bench/gogithub.sh
#   GOGITHUB_OPTIONS='resilience.Options{Name: "go-github", Retry: resilience.RetryOptions{Disabled: true}}' bench/gogithub.sh
#   KEEP=1 bench/gogithub.sh                 # keep the temporary copy (its path is printed)
#
# It fetches github.com/google/go-github/v84 from the module proxy (go mod
# download), copies the module into a temporary directory, replaces the
# Transport of the http.Client that setup() in github/github_test.go builds
# for every test by resilienceTransport(t, transport), which wraps it with
# resilience.NewTransport(transport, GOGITHUB_OPTIONS) (default: the
# standard handler, resilience.Options{Name: "go-github"}), points the
# module at this checkout with a replace directive, runs
# `go test -count=1 -json ./github/...`, and prints the tests (subtests
# included) that passed, failed and were skipped, the names of the failures,
# and each failure's output. One test of its own is added and run apart
# (TestResilienceRefusalKeepsGoGithubRateLimitError): a call the handler
# refuses by a spent quota carries the answer from which go-github's
# CheckResponse builds its *RateLimitError. It exits non-zero when any test
# failed. Not run by CI: it needs the module proxy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${GOGITHUB_VERSION:-latest}
options=${GOGITHUB_OPTIONS:-'resilience.Options{Name: "go-github"}'}
module=github.com/google/go-github/v84

work=$(mktemp -d)
cleanup() {
	if [ "${KEEP:-0}" = 1 ]; then
		echo "kept: $work" >&2
		return
	fi
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

dir=$(GOWORK=off go mod download -json "$module@$version" | jq -r .Dir)
got=$(GOWORK=off go mod download -json "$module@$version" | jq -r .Version)
cp -r "$dir" "$work/go-github"
chmod -R u+w "$work/go-github"
cd "$work/go-github"

# setup() builds the test client as
#	httpClient := &http.Client{
#		Transport: transport,
# and that line must be found exactly once.
setup=github/github_test.go
n=$(grep -c '^		Transport: transport,$' "$setup" || true)
if [ "$n" != 1 ]; then
	echo "gogithub.sh: expected one 'Transport: transport,' line in $setup, found $n: setup() changed" >&2
	exit 2
fi
sed -i 's/^		Transport: transport,$/		Transport: resilienceTransport(t, transport),/' "$setup"
cat >github/resilience_inject_test.go <<EOF
package github

import (
	"net/http"
	"testing"

	"github.com/resilienthttp/resilience"
)

// resilienceTransport wraps the test client's transport with the
// resilience handler under test (bench/gogithub.sh).
func resilienceTransport(t *testing.T, base http.RoundTripper) http.RoundTripper {
	t.Helper()
	rt, err := resilience.NewTransport(base, $options)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

EOF

export GOWORK=off GOFLAGS=-mod=mod
go mod edit -require=github.com/resilienthttp/resilience@v0.0.0-00010101000000-000000000000 \
	-replace=github.com/resilienthttp/resilience="$root"
go mod tidy >/dev/null

echo "go-github $got, options: $options" >&2
start=$(date +%s)
status=0
go test -count=1 -json ./github/... >"$work/test.json" 2>"$work/test.stderr" || status=$?
elapsed=$(($(date +%s) - start))

count() { jq -r --arg a "$1" 'select(.Test != null and .Action == $a) | .Test' "$work/test.json" | wc -l; }
passed=$(count pass)
failed=$(count fail)
skipped=$(count skip)
echo "go-github $got with resilience.NewTransport: $passed passed, $failed failed, $skipped skipped (tests and subtests), ${elapsed}s"
# The slowest tests: where the handler's waits (a retry's backoff, a
# Retry-After, a pause) would show.
echo "slowest:"
jq -r 'select(.Test != null and (.Action == "pass" or .Action == "fail")) | "\(.Elapsed)\t\(.Test)"' "$work/test.json" |
	sort -rn | awk -F '\t' 'NR <= 5 {printf "  %6.2fs %s\n", $1, $2}'
# The added test of the refusal's answer, apart from go-github's own (and
# written only now: it does not build against a checkout older than
# RateLimitError.Response).
cat >github/resilience_answer_test.go <<EOF
package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/resilienthttp/resilience"
)

// Not go-github's: when the handler refuses a call by a spent quota, the
// answer it carries is enough for go-github's CheckResponse to build its
// own *RateLimitError (issue 29, item 3). go-github's own check would
// refuse the second search first; BypassRateLimitCheck lets it through to
// the transport.
func TestResilienceRefusalKeepsGoGithubRateLimitError(t *testing.T) {
	client, mux, _ := setup(t)
	reset := time.Now().UTC().Add(time.Minute).Round(time.Second)
	mux.HandleFunc("/search/issues", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(HeaderRateLimit, "30")
		w.Header().Set(HeaderRateRemaining, "0")
		w.Header().Set(HeaderRateReset, fmt.Sprint(reset.Unix()))
		w.Header().Set(HeaderRateResource, "search")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintln(w, "{\"message\": \"API rate limit exceeded\"}")
	})
	ctx := context.WithValue(t.Context(), BypassRateLimitCheck, true)
	for i := 0; i < 2; i++ {
		req, _ := client.NewRequest("GET", "search/issues?q=x", nil)
		_, err := client.Do(ctx, req, nil)
		var rle *resilience.RateLimitError
		if i == 0 || !errors.As(err, &rle) {
			continue
		}
		var ghErr *RateLimitError
		if !errors.As(CheckResponse(rle.Response), &ghErr) {
			t.Fatalf("CheckResponse(rle.Response) = %v, want a *RateLimitError", CheckResponse(rle.Response))
		}
		if ghErr.Rate.Resource != "search" || ghErr.Rate.Remaining != 0 || !ghErr.Rate.Reset.Time.Equal(reset) {
			t.Fatalf("rate = %+v", ghErr.Rate)
		}
		t.Logf("resilience: %v", err)
		t.Logf("go-github:  %v", ghErr)
		return
	}
	t.Fatal("the second search was not refused by the handler")
}
EOF
extra=0
go test -count=1 -v -run '^TestResilience' ./github/ >"$work/extra.txt" 2>&1 || extra=$?
if [ "$extra" = 0 ]; then
	echo "TestResilienceRefusalKeepsGoGithubRateLimitError (not go-github's): pass"
	grep -E '^[[:space:]]+resilience_answer_test.go' "$work/extra.txt" || true
else
	echo "TestResilienceRefusalKeepsGoGithubRateLimitError (not go-github's): FAIL"
	cat "$work/extra.txt"
fi
if [ "$failed" != 0 ] || [ "$status" != 0 ] || [ "$extra" != 0 ]; then
	echo "failed:"
	jq -r 'select(.Test != null and .Action == "fail") | "  " + .Test' "$work/test.json"
	for t in $(jq -r 'select(.Test != null and .Action == "fail") | .Test' "$work/test.json"); do
		echo "--- $t"
		jq -r --arg t "$t" 'select(.Test == $t and .Action == "output") | .Output' "$work/test.json" | grep -v '^=== \(RUN\|PAUSE\|CONT\)' | grep -v '^[[:space:]]*$' | head -40
	done
	cat "$work/test.stderr" >&2
	exit 1
fi
