# shellcheck shell=bash
# Sourced by .ci/run: installs PostgreSQL (Debian's package) if absent,
# starts a throwaway cluster on loopback in a temporary directory (as the
# postgres user; never the machine's own cluster), creates a database, and
# exports RESILIENCE_TEST_POSTGRES_DSN (and RESILIENCE_TEST_POSTGRES_BIN)
# for the idempotency module's tests,
# with RESILIENCE_REQUIRE_SERVERS=1 so that a missing server fails them
# instead of skipping. The cluster stops when the sourcing shell exits.
# fsync is off (tests need no durability) unless RESILIENCE_PG_FSYNC=on.
# Run alone for a development cluster: `source .ci/postgres.sh`.

pg_bin=""
for d in /usr/lib/postgresql/*/bin; do
  [ -x "$d/initdb" ] && pg_bin="$d"
done
if [ -z "$pg_bin" ]; then
  echo "== installing postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  # Debian's package starts its own cluster; ours is separate.
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && pg_bin="$d"
  done
fi
[ -n "$pg_bin" ] || { echo "postgres.sh: no initdb after installing postgresql"; return 1; }

pg_dir=$(mktemp -d /tmp/resilience-pg.XXXXXX)
chown postgres: "$pg_dir"
pg_as() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_as "$pg_bin/initdb" -D "$pg_dir/data" -U postgres -A trust -E UTF8 --no-sync >/dev/null
pg_port=""
for p in 55432 55433 55434 55435 55436; do
  if pg_as "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $p -k $pg_dir -c fsync=${RESILIENCE_PG_FSYNC:-off} -c max_connections=200" start >/dev/null; then
    pg_port=$p; break
  fi
done
[ -n "$pg_port" ] || { echo "postgres.sh: the cluster would not start:"; cat "$pg_dir/log"; return 1; }
pg_stop() { pg_as "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$pg_dir"; }
pg_prev_trap=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
# shellcheck disable=SC2064
trap "${pg_prev_trap:+$pg_prev_trap; }pg_stop" EXIT
pg_as "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres resilience_test
export RESILIENCE_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:$pg_port/resilience_test?sslmode=disable"
export RESILIENCE_REQUIRE_SERVERS=1
# The server binaries, for tests that start, crash and restart a cluster of
# their own (idempotency/internal/pgtest.NewCluster).
export RESILIENCE_TEST_POSTGRES_BIN="$pg_bin"
echo "== PostgreSQL $("$pg_bin/postgres" -V | awk '{print $3}') on 127.0.0.1:$pg_port ($pg_dir)"
