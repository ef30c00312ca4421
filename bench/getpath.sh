#!/usr/bin/env bash
# getpath.sh: the files one GET with the defaults runs through, beyond
# those that building the handler runs, in the root package and its
# internal/ packages: the files a reader follows a call through. It runs
# TestGetPathBuild and TestGetPathGET (getpath_test.go) apart under
# coverage, and names each file with a statement block that the GET ran
# more often than the build did, with its count of lines.
#
#     bench/getpath.sh          # the list, then the count
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pkgs=github.com/resilienthttp/resilience/...
go test -count=1 -covermode=count -coverpkg="$pkgs" -run '^TestGetPathBuild$' -coverprofile "$dir/build" . >/dev/null
go test -count=1 -covermode=count -coverpkg="$pkgs" -run '^TestGetPathGET$' -coverprofile "$dir/get" . >/dev/null
# A profile line: file:start,end statements count. The same block may be
# listed more than once (one line per package that measured it): add them.
awk 'FNR == 1 {next}
     FILENAME ~ /build$/ {b[$1] += $3; next}
     {g[$1] += $3}
     END {for (k in g) if (g[k] > b[k]) {split(k, p, ":"); f[p[1]] = 1}
          for (x in f) print x}' "$dir/build" "$dir/get" |
	sed 's|^github.com/resilienthttp/resilience/||' | grep -v '^otelresilience/\|^redislimit/\|^idempotency/\|^bench/\|^cmd/\|^resiliencetest/\|^server/' | sort |
	while read -r f; do printf '%5d  %s\n' "$(wc -l <"$f")" "$f"; done
