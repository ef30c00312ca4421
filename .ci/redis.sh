# Sourced by .ci/run: installs redis-server (Debian's package) when it is
# missing, starts one on loopback for the redislimit tests, and exports its
# address; RESILIENCE_REQUIRE_SERVERS=1 makes a test without a server fail
# instead of skipping. The fleet test starts (and kills) servers of its own
# from the same binary. The server is shut down when CI exits.
if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
fi
RESILIENCE_REDIS_PORT=${RESILIENCE_REDIS_PORT:-6390}
redis_dir=$(mktemp -d)
redis-server --port "$RESILIENCE_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$redis_dir" --daemonize yes --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log"
for _ in $(seq 50); do
  redis-cli -p "$RESILIENCE_REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$RESILIENCE_REDIS_PORT" ping >/dev/null || { cat "$redis_dir/redis.log"; echo "redis-server did not start"; exit 1; }
export RESILIENCE_TEST_REDIS_ADDR="127.0.0.1:$RESILIENCE_REDIS_PORT"
export RESILIENCE_REQUIRE_SERVERS=1
stop_redis() { redis-cli -p "$RESILIENCE_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$redis_dir"; }
# Keep any EXIT trap already set (.ci/postgres.sh stops its cluster in one).
redis_prev_trap=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
# shellcheck disable=SC2064
trap "${redis_prev_trap:+$redis_prev_trap; }stop_redis" EXIT
