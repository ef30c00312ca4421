#!/usr/bin/env bash
# Issue 12's experiment and benchmark for the redislimit module, run by
# run.sh (REDISLIMIT=0 skips it) or alone: starts a redis-server on a free
# loopback port, measures the per-call cost of the shared rate beside the
# local one (medians of COUNT rounds), runs the fleet experiment (4
# processes, 200/s, 10 s, Redis killed at 4 s and started again at 6 s)
# and the fleet's Redis round trips per call sent (issue 18: over its
# share, and at 50 calls/s per process), and writes results/redislimit.md.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-1s}
out=$PWD/results/redislimit.md
raw=$PWD/results/redislimit.txt
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export RESILIENCE_TEST_REDIS_ADDR=127.0.0.1:$port RESILIENCE_REQUIRE_SERVERS=1

cd ../redislimit
echo "== redislimit: per-call cost, $COUNT rounds" >&2
: >"$raw"
for i in $(seq "$COUNT"); do
	go test -run '^$' -bench '^BenchmarkRate(Local|Shared)$' -benchmem -benchtime "$BENCHTIME" . | grep '^Benchmark' | tee -a "$raw" >&2
done
median() { grep "^BenchmarkRate$1-" "$raw" | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
local_ns=$(median Local)
shared_ns=$(median Shared)

echo "== redislimit: the fleet experiment (~12 s)" >&2
REDISLIMIT_FLEET_FULL=1 REDISLIMIT_FLEET_REPORT="$dir/fleet.md" go test -count=1 -run '^TestFleet$' -v . >&2
echo "== redislimit: Redis round trips per call sent (~20 s)" >&2
REDISLIMIT_FLEET_TRIPS=1 REDISLIMIT_FLEET_TRIPS_REPORT="$dir/trips.md" go test -count=1 -run '^TestFleetRoundTrips$' -v . >&2
{
	echo "# redislimit: a rate shared through Redis (issues 12 and 18)"
	echo
	echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(go version | awk '{print $3}'), $(nproc) cores, redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	echo "## Per-call cost on the success path (bench/redislimit.sh; medians of $COUNT rounds of -benchtime $BENCHTIME)"
	echo
	echo "A call through a handler over an in-memory upstream, far under the rate."
	echo
	echo "| limiter | ns/op (median) |"
	echo "|---|---:|"
	echo "| local (RateLimitOptions.RequestsPerSecond) | $local_ns |"
	echo "| shared (redislimit, served from the lease) | $shared_ns |"
	echo "| difference | $(awk -v a="$shared_ns" -v b="$local_ns" 'BEGIN{print a-b}') |"
	echo
	echo "Raw lines: results/redislimit.txt."
	echo
	echo "## The fleet: 4 processes, one limit of 200/s, Redis killed and restarted"
	echo
	echo '`REDISLIMIT_FLEET_FULL=1 go test -run TestFleet -v .` in redislimit/ (seconds counted from the common start):'
	echo
	cat "$dir/fleet.md"
	echo
	echo "## Redis round trips per call sent (issue 18)"
	echo
	echo '`REDISLIMIT_FLEET_TRIPS=1 go test -run TestFleetRoundTrips -v .` in redislimit/: the same 4 processes, Redis up all along, 5 s each; a go-redis hook in every process counts its commands and pipelines from the start of the run until its calls have returned.'
	echo
	cat "$dir/trips.md"
} >"$out"
echo "wrote $out" >&2
