#!/usr/bin/env bash
# One kvbridge for a whole fleet (issue 22, section 2): 256 engines, the
# most it takes (kvsim: 32 servers x 8 data-parallel ranks, vLLM's
# ZeroMQ side), under requests at a ladder of rates through a plain
# round-robin nginx (the caches are the engines': routing is not what is
# measured).  For each stage: the bridge's CPU (share of one core, from
# /proc), its RSS and descriptors, the engine batches it took and the
# messages it published.
#
#   bash bench/bench_fleet.sh [QPS[:SECONDS] ...]    (default 20:30 60:30)
#
# Where the bridge saturates, and publish-to-visible through nginx at 256
# caches, are bench/bench_fleet_flood.sh's (synthetic engines: here kvsim
# gives way first).
# Everything runs on 127.0.0.1 under build/bench-fleet/ and stops on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
launch=$root/tools/kva-launch
prefix=$root/build/bench-fleet
SERVERS=32
DP=8
stages=("${@:-20:30 60:30}")
read -r -a stages <<< "${stages[*]}"

for f in "$root/build/kvsim" "$root/build/kvbridge" "$root/build/kvload"; do
    [ -x "$f" ] || { echo "$f missing: make tools" >&2; exit 1; }
done

rm -rf "$prefix"
"$launch" prefix "$prefix" >/dev/null

# one run of ports: the engines' events and replays, the servers, nginx,
# redis, the bridge's metrics
run=$("$launch" port-run $(( 2 * SERVERS * DP + SERVERS + 3 )))
zmq=$run
base=$(( zmq + 2 * SERVERS * DP ))
port=$(( base + SERVERS ))
rport=$(( port + 1 ))
mport=$(( port + 2 ))

bpid=
cleanup() {
    set +e
    [ -n "$bpid" ] && kill "$bpid" 2>/dev/null && wait "$bpid" 2>/dev/null
    "$launch" stop "$prefix"
}
trap cleanup EXIT INT TERM

"$launch" start redis "$prefix" "$rport" >/dev/null
"$launch" start kvsim "$prefix" "$base" "$SERVERS" --data-parallel "$DP" \
    --keyspace tokens --events zmq --redis off --quiet \
    --zmq-port "$zmq" >/dev/null

engines=()
for s in $(seq 0 $(( SERVERS - 1 ))); do
    p=$(( zmq + 2 * DP * s ))
    engines+=(--engine "127.0.0.1:$(( base + s )) model=kvsim
        events=tcp://127.0.0.1:$p replay=tcp://127.0.0.1:$(( p + DP ))
        data_parallel=$DP")
done

"$root/build/kvbridge" --redis "127.0.0.1:$rport" \
    --metrics "127.0.0.1:$mport" --log-level warn "${engines[@]}" \
    > "$prefix/logs/kvbridge.log" 2>&1 &
bpid=$!

servers=$(for s in $(seq 0 $(( SERVERS - 1 ))); do
              echo "server 127.0.0.1:$(( base + s ));"; done)
"$launch" conf "$prefix" --log-level warn <<NGX >/dev/null
    upstream fleet { $servers }
    server {
        listen 127.0.0.1:$port;
        location / { proxy_pass http://fleet; }
    }
NGX
"$launch" start nginx "$prefix" >/dev/null

cpu() { awk '{ print $14 + $15 }' "/proc/$bpid/stat"; }
status() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$bpid/status"; }
metric() {
    curl -s "127.0.0.1:$mport/metrics" \
        | awk -v k="$1" 'index($1, k) == 1 { s += $2 } END { print s + 0 }'
}
hz=$(getconf CLK_TCK)

sleep 3
kill -0 "$bpid" || { cat "$prefix/logs/kvbridge.log" >&2; exit 1; }

printf '| stage | bridge CPU | RSS | descriptors | engine batches | published |\n'
printf '|---|---:|---:|---:|---:|---:|\n'

# measure NAME OUTPUT COMMAND...: the row of what COMMAND cost the bridge
measure() {
    local name=$1 out=$2; shift 2
    local c0 t0 b0 p0 c1 t1
    c0=$(cpu); t0=$(date +%s.%N)
    b0=$(metric kvbridge_engine_batches_total)
    p0=$(metric kvbridge_redis_published_total)
    "$@" > "$out" 2>&1 || true
    c1=$(cpu); t1=$(date +%s.%N)
    printf '| %s | %.1f%% | %d MB | %d | %d | %d |\n' "$name" \
        "$(echo "($c1 - $c0) / $hz / ($t1 - $t0) * 100" | bc -l)" \
        $(( $(status VmRSS) / 1024 )) "$(ls "/proc/$bpid/fd" | wc -l)" \
        $(( $(metric kvbridge_engine_batches_total) - b0 )) \
        $(( $(metric kvbridge_redis_published_total) - p0 ))
}

measure "idle, 10 s (heartbeats)" /dev/null sleep 10

for st in "${stages[@]}"; do
    qps=${st%%:*}
    secs=${st#*:}; [ "$secs" = "$st" ] && secs=30
    measure "$qps req/s, $secs s" "$prefix/kvload-$qps.out" \
        "$root/build/kvload" \
        --target "127.0.0.1:$port" --prompt-ids 1 --workload shared-prefix \
        --qps-ladder "$qps:$secs" --system-tokens 2000 \
        --question-tokens 200 --output-tokens 32 --groups 400 \
        --drain-seconds 10
done

printf '\nbridge peak RSS %d MB; kvbridge.log: %d warnings\n' \
    $(( $(status VmHWM) / 1024 )) \
    "$(grep -c ' warn: ' "$prefix/logs/kvbridge.log" || true)"
