#!/usr/bin/env bash
# The idempotency middleware's added latency (BenchmarkIdempotency), on
# SQLite and on a PostgreSQL server started here (../.ci/postgres.sh, with
# fsync on: commits are as durable as in production), COUNT rounds of
# BENCHTIME requests per case. Writes the raw output to
# results/idempotency.txt and the table of medians to results/idempotency.md.
#
#   ./idempotency.sh                 # COUNT=5 rounds of 2000 requests, ~2 min
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
COUNT=${COUNT:-5}
BENCHTIME=${BENCHTIME:-2000x}

export RESILIENCE_PG_FSYNC=on
# shellcheck source=../.ci/postgres.sh
source ../.ci/postgres.sh

mkdir -p results
out=results/idempotency.txt
{
	echo "go-version: $(go version | awk '{print $3}')"
	echo "nproc: $(nproc)"
	echo "cpu-model: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1 | tr ' ' '_')"
	echo "postgres: $("$pg_bin/postgres" -V | awk '{print $3}') fsync=on"
	echo "load-before: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out"
go test -c -o results/bench.test .
results/bench.test -test.run '^$' -test.bench '^BenchmarkIdempotency$' \
	-test.benchtime "$BENCHTIME" -test.count "$COUNT" | tee -a "$out" | grep '^Benchmark' >&2
echo "load-after: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')" >>"$out"

# Medians over the rounds of each case's p50 and p99, and the added
# latency: the middleware's p50 (p99) less bare's, on the same store.
awk '
/^BenchmarkIdempotency\// {
	split($1, p, "/"); store = p[2]; mw = p[3]; sub(/-[0-9]+$/, "", mw)
	for (i = 2; i <= NF; i++) {
		if ($(i) == "p50-µs") p50[store, mw] = p50[store, mw] " " $(i-1)
		if ($(i) == "p99-µs") p99[store, mw] = p99[store, mw] " " $(i-1)
	}
	if (!((store, mw) in seen)) { seen[store, mw] = 1; order[++n] = store SUBSEP mw }
}
function median(s,   a, k, i, j, t) {
	k = split(s, a, " ")
	for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
END {
	print "| store | middleware | p50 µs | p99 µs | added p50 µs | added p99 µs |"
	print "|---|---|---:|---:|---:|---:|"
	for (i = 1; i <= n; i++) {
		split(order[i], k, SUBSEP); s = k[1]; m = k[2]
		m50 = median(p50[s, m]); m99 = median(p99[s, m])
		b50 = median(p50[s, "mw=bare"]); b99 = median(p99[s, "mw=bare"])
		add50 = (m == "mw=bare") ? "" : sprintf("%+.0f", m50 - b50)
		add99 = (m == "mw=bare") ? "" : sprintf("%+.0f", m99 - b99)
		printf "| %s | %s | %.0f | %.0f | %s | %s |\n", substr(s, 7), substr(m, 4), m50, m99, add50, add99
	}
}' "$out" >results/idempotency.table
{
	echo "# Idempotency middleware: added latency per request"
	echo
	echo "\`bench/idempotency.sh\` (COUNT=$COUNT, BENCHTIME=$BENCHTIME), $(sed -n 's/^date: //p' "$out"), $(sed -n 's/^go-version: //p' "$out"), $(nproc) cores, load $(sed -n 's/^load-before: //p' "$out") before, $(sed -n 's/^load-after: //p' "$out") after; PostgreSQL $(sed -n 's/^postgres: //p' "$out") on loopback. Medians over the rounds of each round's p50 and p99."
	echo
	cat results/idempotency.table
} >results/idempotency.md
rm -f results/idempotency.table
cat results/idempotency.md
rm -f results/bench.test
