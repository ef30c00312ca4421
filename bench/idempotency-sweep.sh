#!/usr/bin/env bash
# The idempotency sweep's bound on storage (BenchmarkIdempotencySweep,
# issue 29 item 12): keyed writes at 200 and 2,000 a second for 10 s with a
# TTL of 200 ms and sweeps due every 600 ms from batches of 10 (the
# defaults' deletion rate, scaled as the issue scaled it), on SQLite and on
# a PostgreSQL server started here (../.ci/postgres.sh, fsync on unless
# RESILIENCE_PG_FSYNC=off). COUNT rounds of each case that CASES matches
# (a -test.bench pattern under BenchmarkIdempotencySweep). Writes the raw
# output to results/$OUT.txt and the table to results/$OUT.md.
#
#   ./idempotency-sweep.sh            # COUNT=1 round per case, ~2.5 min
#   RESILIENCE_PG_FSYNC=off CASES=store=postgres OUT=idempotency-sweep-pg-fsync-off ./idempotency-sweep.sh
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
COUNT=${COUNT:-1}
CASES=${CASES:-}
OUT=${OUT:-idempotency-sweep}

export RESILIENCE_PG_FSYNC=${RESILIENCE_PG_FSYNC:-on}
# shellcheck source=../.ci/postgres.sh
source ../.ci/postgres.sh

mkdir -p results
out=results/$OUT.txt
{
	echo "go-version: $(go version | awk '{print $3}')"
	echo "nproc: $(nproc)"
	echo "cpu-model: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1 | tr ' ' '_')"
	echo "postgres: $("$pg_bin/postgres" -V | awk '{print $3}') fsync=$RESILIENCE_PG_FSYNC"
	echo "load-before: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out"
go test -c -o results/sweep.test .
results/sweep.test -test.run '^$' -test.bench "^BenchmarkIdempotencySweep\$${CASES:+/$CASES}" \
	-test.benchtime 1x -test.count "$COUNT" | tee -a "$out" | grep '^Benchmark' >&2
echo "load-after: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')" >>"$out"
rm -f results/sweep.test

# One row per round: the metrics by name.
awk '
/^BenchmarkIdempotencySweep\// {
	split($1, p, "/"); store = substr(p[2], 7); rate = p[3]; sub(/^rate=/, "", rate); sub(/-[0-9]+$/, "", rate)
	delete m
	for (i = 3; i < NF; i += 2) m[$(i+1)] = $(i)
	printf "| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", store, rate, m["writes/s"], m["bound"], m["rows-peak"], m["rows-end"], m["rows-2s"], m["deleted"], m["sweeps"], m["behind"], m["lag-max-ms"], m["not-201"]
}' "$out" >"results/$OUT.rows"
{
	echo "# Idempotency sweep: keys kept at 200 and 2,000 keyed writes/s"
	echo
	echo "\`bench/idempotency-sweep.sh\` (COUNT=$COUNT), $(sed -n 's/^date: //p' "$out"), $(sed -n 's/^go-version: //p' "$out"), $(nproc) cores, load $(sed -n 's/^load-before: //p' "$out") before, $(sed -n 's/^load-after: //p' "$out") after; PostgreSQL $(sed -n 's/^postgres: //p' "$out") on loopback, 32 writers; SQLite 4 writers, synchronous FULL (the store's) or NORMAL. TTL 200 ms, SweepInterval 600 ms, SweepBatch 10, writes for 10 s, open loop. *bound*: (TTL + SweepInterval) × the rate achieved, what TTL implies with a sweep due every interval. Rows: the table's keys (count(*)), at most while writing (sampled every 100 ms), at the end of the writes, and 2 s later (sweeps run on writes: none after the last). *lag max*: the largest SweepReport.Lag. Raw: results/$OUT.txt."
	echo
	echo "| store | offered/s | writes/s | bound | rows peak | rows at end | rows 2 s after | deleted | sweeps | behind | lag max ms | not 201 |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	cat "results/$OUT.rows"
} >"results/$OUT.md"
rm -f "results/$OUT.rows"
cat "results/$OUT.md"
