#!/usr/bin/env bash
# Two `tandem serve` replicas on loopback behind HAProxy (deploy/haproxy/haproxy.cfg):
# throughput through one replica vs two, then a rolling restart under load (drain replica 1
# with SIGTERM, restart it, then replica 2) counting failed requests (the goal: 0).
#
#   scripts/replicas_demo.sh [TANDEM_BIN] [SECONDS]
#
# Needs haproxy (Debian: apt-get install haproxy) and python3. Uses the default model, one
# kernel thread per replica, ports 18001/18002 and 18080 on 127.0.0.1; stops what it starts.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/target/release/tandem}
SECONDS_PER_RUN=${2:-30}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

start_replica() { # N -> pid in REPLICA_PID
    "$BIN" serve --port "1800$1" --threads 1 --shutdown-timeout 30 --log-level warn \
        > "$WORK/replica$1.log" 2>&1 &
    REPLICA_PID=$!
    PIDS+=("$REPLICA_PID")
    for _ in $(seq 1 600); do
        curl -sf "127.0.0.1:1800$1/health" > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "replica $1 did not start"; exit 1
}

sed -e 's/127.0.0.1:8080/127.0.0.1:18080/' -e 's/127.0.0.1:8001/127.0.0.1:18001/' \
    -e 's/127.0.0.1:8002/127.0.0.1:18002/' "$ROOT/deploy/haproxy/haproxy.cfg" > "$WORK/haproxy.cfg"
start_replica 1; R1=$REPLICA_PID
start_replica 2; R2=$REPLICA_PID

echo "== one replica, then two (concurrency 8, ${SECONDS_PER_RUN} s each)"
echo "one replica:  $(python3 "$ROOT/scripts/replicas_load.py" 18001 8 "$SECONDS_PER_RUN")"
haproxy -f "$WORK/haproxy.cfg" -db > "$WORK/haproxy.log" 2>&1 &
HAPROXY=$!
PIDS+=("$HAPROXY")
sleep 2
echo "two replicas: $(python3 "$ROOT/scripts/replicas_load.py" 18080 8 "$SECONDS_PER_RUN")"

echo "== rolling restart under load (concurrency 8)"
python3 "$ROOT/scripts/replicas_load.py" 18080 8 $((SECONDS_PER_RUN * 3)) > "$WORK/rolling.json" &
LOAD=$!
sleep 5
for n in 1 2; do
    pid=$R1; [ "$n" = 2 ] && pid=$R2
    echo "draining replica $n (SIGTERM)"
    kill -TERM "$pid"
    status=0; wait "$pid" || status=$?
    echo "replica $n exited with status $status; restarting"
    start_replica "$n"
    [ "$n" = 1 ] && R1=$REPLICA_PID || R2=$REPLICA_PID
    sleep 3
done
wait "$LOAD"
echo "rolling restart: $(cat "$WORK/rolling.json")"
