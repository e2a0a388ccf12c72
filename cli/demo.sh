#!/usr/bin/env bash
# The `redlease` command in action: two cron-style "hosts" contend for one job.
#
# Uses REDIS_URL when set; otherwise starts (and stops) a redis-server of its own on a unix
# socket in a temporary directory. Builds the binary first (set REDLEASE_BIN to use another).
# Takes about 10 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/deps.sh # installs redis-server when missing

if [ -z "${REDLEASE_BIN:-}" ]; then
  cargo build --quiet -p redlease-cli
  REDLEASE_BIN=$PWD/target/debug/redlease
fi
redlease() { "$REDLEASE_BIN" "$@"; }

tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "${REDIS_URL:-}" ]; then
  redis-server --port 0 --unixsocket "$tmp/redis.sock" --save "" --appendonly no \
    --dir "$tmp" --logfile "$tmp/redis.log" &
  server_pid=$!
  for _ in $(seq 200); do [ -S "$tmp/redis.sock" ] && break; sleep 0.05; done
  export REDIS_URL="redis+unix://$tmp/redis.sock"
  echo "started redis-server (pid $server_pid) on $REDIS_URL"
fi
set +e

# What each host's crontab would run every minute; here a "minute" is one second and the
# job takes 1.5 s, so runs overlap: the lock makes every host skip while one runs.
job='echo "    [$HOST] running, fencing token $REDLEASE_FENCING_TOKEN"; sleep 1.5'
cron_tick() { # host
  HOST=$1 redlease run --ttl 10s nightly-report -- sh -c "$job" 2>&1 | sed -u "s/^redlease:/    [$1] redlease:/"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && echo "    [$1] exit $rc"
}

echo
echo "== 1. cron on two hosts, every 'minute', no waiting (the default: --wait 0)"
pids=()
for tick in 1 2 3; do
  echo "  minute $tick"
  cron_tick host-a & pids+=($!)
  cron_tick host-b & pids+=($!)
  sleep 1
done
wait "${pids[@]}"
echo "  (exit 75 = busy: that host skipped the run; no two ran at once)"

echo
echo "== 2. with --wait 10s the second host queues and runs right after the first"
pids=()
for host in host-a host-b; do
  HOST=$host redlease run --wait 10s --ttl 10s nightly-report -- sh -c "$job" & pids+=($!)
done
wait "${pids[@]}"

echo
echo "== 3. operators: status and list while a job runs"
HOST=host-a redlease run --ttl 1s nightly-report -- sleep 5 &
holder=$!
sleep 0.3
redlease status nightly-report
redlease list --json

echo
echo "== 4. breaking the lock: the running job learns it lost the lock, gets SIGTERM, exit 76"
redlease release nightly-report # refuses without --force (exit 64)
echo "  (exit $?)"
redlease release nightly-report --force
wait "$holder"
echo "  the job's redlease exited $?"

echo
echo "== 5. is this server fit for locks?"
redlease check
echo "  (exit $?: 69 only when the eviction policy could delete lock keys or Redis is unreachable)"
