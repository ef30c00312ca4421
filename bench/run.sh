#!/usr/bin/env bash
# Runs every benchmark and experiment of this module, writes the raw output
# to results/latest.txt (the herd histograms to results/herd.txt), and prints
# a benchstat table (peers as columns, deltas against bare) and the tables of
# results/latest.md: ratios to bare, memory, faults, herd, hedging, retry
# budget, and the targets of issues 3 and 5; then the do-no-harm tables and
# issue 9's targets (results/donoharm.md), and the overload experiment's
# tables (results/overload.md, issue 19).
#
#   ./run.sh                      # COUNT=6 rounds, ~13 minutes on 2 cores
#   DONOHARM=0 ./run.sh           # without the do-no-harm experiment (~6 min)
#   PACING=0 ./run.sh             # without the pacing experiment (~1 min)
#   OVERLOAD=0 ./run.sh           # without the overload experiment (~17 min
#                                 # with OVERLOAD_SEEDS=1, the default here;
#                                 # OVERLOAD_SEEDS=1,2,3 takes ~50 min)
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
FAULTCOUNT=${FAULTCOUNT:-1} # rounds of the faults experiment (~65 s each)
HERDCOUNT=${HERDCOUNT:-3}   # rounds of the herd experiment (~1.5 s each)
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
# The experiments run once per round whatever b.N: -benchtime 1x.
echo "== faults experiment ($FAULTCOUNT round(s), ~65 s each)" >&2
"$bin" -test.run '^$' -test.bench '^BenchmarkFaults$' -test.benchtime 1x \
	-test.count "$FAULTCOUNT" | tee -a "$out" | grep '^Benchmark' >&2
echo "== herd experiment ($HERDCOUNT rounds)" >&2
BENCH_RESULTS=results "$bin" -test.run '^$' -test.bench '^BenchmarkHerd$' -test.benchtime 1x \
	-test.count "$HERDCOUNT" | tee -a "$out" | grep '^Benchmark' >&2
echo "== hedging experiment (1 round, ~50 s)" >&2
"$bin" -test.run '^$' -test.bench '^BenchmarkHedging$' -test.benchtime 1x \
	| tee -a "$out" | grep '^Benchmark' >&2
echo "== hedging across endpoints (1 round, ~75 s; its table goes to results/hedging.md)" >&2
BENCH_RESULTS=results "$bin" -test.run '^$' -test.bench '^BenchmarkEndpointHedging$' -test.benchtime 1x \
	| tee -a "$out" | grep '^Benchmark' >&2
echo "== retry budget experiment (1 round, ~8 s)" >&2
"$bin" -test.run '^$' -test.bench '^BenchmarkRetryBudget$' -test.benchtime 1x \
	| tee -a "$out" | grep '^Benchmark' >&2
if [ "${PACING:-1}" != 0 ]; then
	# 200 calls against 50 per 10 s: four windows, ~65 s for the four peers.
	echo "== pacing experiment (1 round, ~65 s; PACING=0 skips it)" >&2
	"$bin" -test.run '^$' -test.bench '^BenchmarkPacing$' -test.benchtime 1x \
		| tee -a "$out" | grep '^Benchmark' >&2
fi
if [ "${DONOHARM:-1}" != 0 ]; then
	# Its tables go to results/donoharm.md, not to latest.txt.
	echo "== do-no-harm experiment (1 round, ~10 minutes; DONOHARM=0 skips it)" >&2
	"$bin" -test.run '^$' -test.bench '^BenchmarkDoNoHarm$' -test.benchtime 1x | grep '^Benchmark' >&2
fi
if [ "${OVERLOAD:-1}" != 0 ]; then
	# Issue 19: its tables go to results/overload.md, its timelines to
	# results/overload-*.svg, not to latest.txt.
	echo "== overload experiment (1 round, ~17 min per seed; OVERLOAD=0 skips it)" >&2
	OVERLOAD_SEEDS=${OVERLOAD_SEEDS:-1} "$bin" -test.run '^$' -test.bench '^BenchmarkOverload$' -test.benchtime 1x \
		-test.timeout 3h | grep '^Benchmark' >&2
	echo "== overload no-harm probes (~80 s; results/overload-noharm.md)" >&2
	"$bin" -test.run '^$' -test.bench '^BenchmarkOverloadNoHarm$' -test.benchtime 1x | grep '^Benchmark' >&2
fi
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
# The experiments run once per round: benchstat has nothing to say about them.
go run "$BENCHSTAT" -col /peer -filter '-.name:(Faults OR Herd OR Hedging OR EndpointHedging OR RetryBudget OR Pacing)' "$out"
echo
cat results/herd.txt
echo
go run ./cmd/ratios "$out" | tee results/latest.md
if [ "${DONOHARM:-1}" != 0 ]; then
	echo
	cat results/donoharm.md
fi
if [ "${OVERLOAD:-1}" != 0 ]; then
	echo
	cat results/overload.md results/overload-noharm.md
fi

# Issue 12: the rate shared through Redis (needs redis-server).
if [ "${REDISLIMIT:-1}" != 0 ]; then
	./redislimit.sh
fi
