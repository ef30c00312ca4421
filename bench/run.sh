#!/usr/bin/env bash
# Runs every benchmark of this module, writes the raw output to
# results/latest.txt, and prints a benchstat table (peers as columns, deltas
# against bare) and the ratios-to-bare table with the targets of issue 3.
#
#   ./run.sh                      # COUNT=6 rounds, ~4 minutes on 2 cores
#   COUNT=10 BENCHTIME=2s ./run.sh
#   PROFILE=1 ./run.sh            # also CPU and allocation profiles of the
#                                 # resilience success path in results/
#
# Rounds are interleaved (one pass over every benchmark per round) so that a
# drift in machine load hits every peer alike.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

COUNT=${COUNT:-6}          # rounds of the time benchmarks
MEMCOUNT=${MEMCOUNT:-3}    # rounds of the 64 MiB PUT benchmark
BENCHTIME=${BENCHTIME:-1s} # per time benchmark and round
BENCHSTAT=${BENCHSTAT:-golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da}

mkdir -p results
out=results/latest.txt
bin=results/bench.test
go test -c -o "$bin" .

{
	echo "go-version: $(go version | awk '{print $3}')"
	echo "nproc: $(nproc)"
	echo "cpu-model: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1 | tr ' ' '_')"
	echo "load-before: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out"

for i in $(seq "$COUNT"); do
	echo "== round $i/$COUNT: overhead and loopback" >&2
	"$bin" -test.run '^$' -test.bench '^Benchmark(Overhead|OverheadParallel|Loopback)$' \
		-test.benchmem -test.benchtime "$BENCHTIME" | tee -a "$out" | grep '^Benchmark' >&2
done
for i in $(seq "$MEMCOUNT"); do
	echo "== round $i/$MEMCOUNT: 64 MiB PUT memory" >&2
	"$bin" -test.run '^$' -test.bench '^BenchmarkPutMemory$' \
		-test.benchmem -test.benchtime 2x | tee -a "$out" | grep '^Benchmark' >&2
done
echo "load-after: $(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')" >>"$out"

if [ -n "${PROFILE:-}" ]; then
	# Two runs: recording every allocation (memprofilerate 1, exact counts)
	# slows the CPU profile down and fills it with stack unwinding.
	echo "== profiles of BenchmarkOverhead/peer=resilience" >&2
	sel='^BenchmarkOverhead$/^peer=resilience$'
	"$bin" -test.run '^$' -test.bench "$sel" -test.benchmem -test.benchtime 3s \
		-test.cpuprofile results/cpu.out >/dev/null
	"$bin" -test.run '^$' -test.bench "$sel" -test.benchmem -test.benchtime 1s \
		-test.memprofile results/mem.out -test.memprofilerate 1 >/dev/null
	go tool pprof -top -cum -nodecount 40 "$bin" results/cpu.out >results/cpu.txt 2>/dev/null
	go tool pprof -top -lines -sample_index=alloc_objects "$bin" results/mem.out >results/mem.txt 2>/dev/null
	echo "   results/cpu.txt, results/mem.txt" >&2
fi

echo
go run "$BENCHSTAT" -col /peer "$out"
echo
go run ./cmd/ratios "$out" | tee results/latest.md
