#!/usr/bin/env bash
# instructions.sh: instructions per call on the success path, counted by
# valgrind's callgrind, for the peers of BenchmarkOverhead and the rows of
# BenchmarkOverheadLayers.
#
# Time per call on a shared VM moves by 20-40 % between rounds, bare
# included; an instruction count does not (within 1 % between runs), so a
# change of a few per cent to the handler's own work shows in one run.
# Each count is (Ir(2N) - Ir(N)) / N, which cancels start-up, with the
# collector off (GOGC=off: its work follows the bytes allocated, which
# B/op reports), one P and no asynchronous preemption (callgrind does not
# survive Go's preemption signals). What it cannot see is what an
# instruction costs: atomics, cache misses and the collector are in
# sec/op only.
#
# Needs valgrind (apt-get install valgrind). Run from bench/:
#
#     ./instructions.sh            # N = 30000
#     N=100000 ./instructions.sh
#     ./instructions.sh 'BenchmarkOverheadLayers$/^layer=defaults\+onevent$'   # only these rows
set -euo pipefail
cd "$(dirname "$0")"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
n=${N:-30000}
bin=$(mktemp -d)/bench.test
go test -c -o "$bin" .

# ir BENCH N: the instructions callgrind collected for N ops of BENCH.
# valgrind does not decode RDTSCP, which runtime.cputicks executes when a
# runtime lock spins (sysmon's, and every loopback call's timers): the
# runtime is told not to use it (GODEBUG cpu.rdtscp=off), and a run that
# dies anyway is repeated, up to 5 times.
ir() {
	local out i
	for i in 1 2 3 4 5; do
		if out=$(GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
			"$bin" -test.run '^$' -test.bench "$1" -test.benchtime "${2}x" 2>&1); then
			awk '/Collected/ {print $4}' <<<"$out"
			return
		fi
	done
	echo "instructions.sh: $1 failed 5 times under valgrind:" >&2
	tail -20 <<<"$out" >&2
	return 1
}

rows=("$@")
if [ ${#rows[@]} -eq 0 ]; then
	rows=(
		'BenchmarkOverhead$/^peer=bare$'
		'BenchmarkOverhead$/^peer=resilience$'
		'BenchmarkOverhead$/^peer=resilience-limiter-off$'
		'BenchmarkOverhead$/^peer=failsafehttp$'
		'BenchmarkOverhead$/^peer=retryablehttp$'
		'BenchmarkOverheadLayers$/^layer=off$'
		'BenchmarkOverheadLayers$/^layer=defaults$'
		'BenchmarkOverheadLayers$/^layer=defaults\+onevent$'
		'BenchmarkOverheadLayers$/^layer=defaults\+logger$'
	)
fi
printf '| benchmark | instructions/op |\n|---|---:|\n'
for b in "${rows[@]}"; do
	a=$(ir "$b" "$n")
	c=$(ir "$b" $((2 * n)))
	name=${b//[\$\^\\]/}
	printf '| %s | %d |\n' "$name" $(((c - a) / n))
done
rm -rf "$(dirname "$bin")"
