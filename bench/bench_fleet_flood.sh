#!/usr/bin/env bash
# Where one kvbridge for a whole fleet saturates (issue 22, section 2):
# 256 engines (32 servers x data_parallel=8) that are not simulators but
# ZeroMQ publishers of vLLM's events at a rate set from outside
# (bench/events/fleetpub.pl, one process), so that the bridge, not kvsim,
# gives way first.  255 engines flood at a ladder of batch rates; the
# 256th (server 31, rank 0) is the probe of bench/events/bridgebench.pl:
# it publishes a new prompt's BlockStored and a client asks nginx
# (keys=tokens, an upstream of the same 256 caches) for that prompt until
# it is routed with X-KV-Matched > 0.  For each rate:
#
#   - batches and block hashes (stored + removed) the bridge took per
#     second (its metrics page), against the rate offered;
#   - the bridge's CPU (share of one core, /proc), RSS, its loop turns a
#     second, the messages it dropped because Redis was behind, and the
#     publisher's CPU (to tell which was the limit);
#   - publish-to-visible p50 / p99 through the bridge, Redis and nginx.
#
# The ladder stops after the first stage where the bridge took under 90%
# of what the publisher sent, or where the p99 passed 500 ms (the bridge
# saturated), or where the publisher sent under 90% of the rate asked
# (the machine is the limit: then the bridge's CPU per batch tells how
# far it would go).
#
#   bash bench/bench_fleet_flood.sh [--quick] [BATCHES_PER_SECOND ...]
#       default 0 500 1000 2000 4000 8000 16000 (0: every engine
#       connected and silent, the bridge's heartbeats alone); 16 blocks
#       stored and 16 removed a batch (FLOOD_BLOCKS=H); --quick: 0 2000,
#       fewer probes
#
# Everything runs on 127.0.0.1 under build/bench-fleet-flood/ and stops
# on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
quick=0
[ "${1:-}" = "--quick" ] && { quick=1; shift; }
rates=("$@")
[ ${#rates[@]} -gt 0 ] || if [ $quick = 1 ]; then rates=(0 2000)
                           else rates=(0 500 1000 2000 4000 8000 16000); fi

SERVERS=32
DP=8
BLOCKS=${FLOOD_BLOCKS:-16}
K=$(( quick ? 30 : 200 ))          # probes a stage
STAGE=$(( quick ? 6 : 15 ))        # seconds a stage at least
MODEL=bench-model

module=$root/build/ngx_http_kv_aware_module.so
prefix=$root/build/bench-fleet-flood
launch=$root/tools/kva-launch

for f in "$module" "$root/build/kvbridge"; do
    [ -f "$f" ] || { echo "$f missing: make module tools" >&2; exit 1; }
done
for b in nginx redis-server curl perl bc; do
    command -v $b >/dev/null || { echo "$b is missing:" \
        "bash tools/install-deps.sh" >&2; exit 1; }
done
perl -MZMQ::FFI -MData::MessagePack -e 1 2>/dev/null || {
    echo "perl's ZMQ::FFI and Data::MessagePack are missing:" \
         "apt-get install libzmq-ffi-perl libdata-messagepack-perl" >&2
    exit 1; }

# one run at a time: a second would remove the first one's pid files
# and leave its processes running
mkdir -p "$root/build"
exec 9> "$prefix.lock"
flock -n 9 || { echo "another run holds $prefix.lock" >&2; exit 1; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$prefix"
"$launch" prefix "$prefix" >/dev/null

# a run of ports for the engines (rank r of server s at zmq + 8 s + r),
# one for the servers, then nginx, redis, the bridge's metrics
zmq=$("$launch" port-run $(( SERVERS * DP + SERVERS + 3 )))
base=$(( zmq + SERVERS * DP ))
port=$(( base + SERVERS ))
rport=$(( port + 1 ))
mport=$(( port + 2 ))

fpid=
cleanup() {
    set +e
    [ -n "$fpid" ] && kill "$fpid" 2>/dev/null && wait "$fpid" 2>/dev/null
    "$launch" stop "$prefix"
}
trap cleanup EXIT INT TERM

"$launch" start redis "$prefix" "$rport" \
    --client-output-buffer-limit pubsub 0 0 0 >/dev/null

listens=$(for s in $(seq 0 $(( SERVERS - 1 ))); do
              echo "listen 127.0.0.1:$(( base + s ));"; done)
servers=$(for s in $(seq 0 $(( SERVERS - 1 ))); do
              echo "server 127.0.0.1:$(( base + s ));"; done)
KV_AWARE_MODULE=$module "$launch" conf "$prefix" --log-level notice \
    --connections 4096 <<EOF >/dev/null
    client_body_buffer_size 64k;

    upstream llm {
        kv_aware keys=tokens block_tokens=16 data_parallel=$DP
                 index_size=64m;
        kv_aware_events redis=127.0.0.1:$rport heartbeat=3600s
                        speculative_ttl=10ms max_rate=1000000
                        server_bytes=512m server_hashes=100000000;
        $servers
        keepalive 32;
    }

    server {
        listen 127.0.0.1:$port;
        keepalive_requests 1000000;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank \$kv_aware_dp_rank;
            add_header X-KV-Matched \$kv_aware_matched;
        }
    }

    server {
        $listens
        keepalive_requests 1000000;
        location / { return 200 '{"ok":true}'; }
    }
EOF
"$launch" start nginx "$prefix"

engines=()
for s in $(seq 0 $(( SERVERS - 1 ))); do
    engines+=(--engine "127.0.0.1:$(( base + s )) model=$MODEL
        events=tcp://127.0.0.1:$(( zmq + DP * s )) data_parallel=$DP")
done
"$launch" start kvbridge "$prefix" --redis "127.0.0.1:$rport" \
    --metrics "127.0.0.1:$mport" "${engines[@]}"
bpid=$("$launch" pid "$prefix" kvbridge)
grep -q kvbridge "/proc/$bpid/comm" || { echo "no kvbridge at $bpid" >&2
                                         exit 1; }

hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss() { awk '$1 == "VmRSS:" { print int($2 / 1024) }' "/proc/$1/status"; }
now() { date +%s.%N; }
# the sum of the bridge's series whose names start with each argument
metrics() {
    curl -s "127.0.0.1:$mport/metrics" | awk '
        BEGIN { n = split("'"$*"'", k, " ") }
        { for (i = 1; i <= n; i++) if (index($1, k[i]) == 1) s[i] += $2 }
        END { for (i = 1; i <= n; i++) printf "%.0f ", s[i]; print "" }'
}
pct() {    # pct P < numbers  (nearest rank)
    sort -g | awk -v p="$1" '{ a[NR] = $1 } END {
        i = int(NR * p / 100 + 0.999999); if (i < 1) i = 1; print a[i] }'; }
# wait, at most 60 s, until the bridge takes no more batches: the queues
# of the stage before drained (its CPU never rests while engines are
# away: ZeroMQ retries each one's connection every 100 ms)
settle() {
    local prev=-1 c
    for _ in $(seq 60); do
        c=$(metrics kvbridge_engine_batches_total)
        [ "$c" = "$prev" ] && return
        prev=$c; sleep 1
    done
}
M="kvbridge_engine_batches_total kvbridge_engine_mirror_stored_total
   kvbridge_engine_mirror_removed_total kvbridge_redis_published_total
   kvbridge_engine_gaps_total kvbridge_loop_turn_seconds_count
   kvbridge_redis_dropped_total"
# what the publisher sent so far (it answers SIGUSR1 with "BATCHES SECS")
sent() {
    local n
    n=$(grep -c . "$prefix/pub-$rate.out" || true)
    kill -USR1 "$fpid"
    for _ in $(seq 50); do
        [ "$(grep -c . "$prefix/pub-$rate.out" || true)" -gt "$n" ] && break
        sleep 0.02
    done
    tail -n 1 "$prefix/pub-$rate.out" | cut -d' ' -f1
}

sleep 2
settle
{
echo "one kvbridge, $(( SERVERS * DP )) engines ($SERVERS servers x" \
     "data_parallel=$DP), 255 flooding ($BLOCKS blocks stored + $BLOCKS" \
     "removed a batch), 1 probing ($K probes a stage); $(nproc) cores," \
     "load average $load0 at the start"
echo
echo "| offered batches/s | sent | taken | hashes/s | published msg/s | loop turns/s | bridge CPU | publisher CPU | RSS | gaps | dropped msg | publish-to-visible p50 / p99 |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
} | tee "$prefix/result.md"

for rate in "${rates[@]}"; do
    perl "$root/bench/events/fleetpub.pl" --zmq "$zmq" --servers $SERVERS \
        --ranks $DP --skip $(( (SERVERS - 1) * DP )) --rate "$rate" \
        --blocks "$BLOCKS" --seconds $(( STAGE + 120 )) \
        > "$prefix/pub-$rate.out" 2>&1 &
    fpid=$!
    for _ in $(seq 600); do           # its packing, its 1 s to connect
        grep -q ready "$prefix/pub-$rate.out" && break
        kill -0 "$fpid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q ready "$prefix/pub-$rate.out" || {
        echo "the publisher did not start:" >&2
        cat "$prefix/pub-$rate.out" >&2; exit 1; }
    sleep 1
    read -r b0 s0 d0 p0 g0 l0 x0 < <(metrics $M)
    n0=$(sent); c0=$(ticks "$bpid"); f0=$(ticks "$fpid"); t0=$(now)
    perl "$root/bench/events/bridgebench.pl" latency \
        --zmq $(( zmq + DP * (SERVERS - 1) )) --port "$port" \
        --model "$MODEL" --count $K > "$prefix/lat-$rate.out" \
        2> "$prefix/lat-$rate.err" || true
    while perl -e 'exit(($ARGV[1] - $ARGV[0]) < $ARGV[2] ? 0 : 1)' \
          "$t0" "$(now)" "$STAGE"; do sleep 0.5; done
    read -r b1 s1 d1 p1 g1 l1 x1 < <(metrics $M)
    n1=$(sent); c1=$(ticks "$bpid"); f1=$(ticks "$fpid"); t1=$(now)
    mem=$(rss "$bpid")
    kill "$fpid"; wait "$fpid" 2>/dev/null || true; fpid=

    dt=$(echo "$t1 - $t0" | bc -l)
    taken=$(echo "($b1 - $b0) / $dt" | bc -l)
    sent=$(echo "($n1 - $n0) / $dt" | bc -l)
    n=$(grep -c . "$prefix/lat-$rate.out" || true)
    if [ "$n" -gt 0 ]; then
        lat=$(printf '%.2f / %.2f ms (%d probes)' \
            "$(awk '{ print $1 * 1000 }' "$prefix/lat-$rate.out" | pct 50)" \
            "$(awk '{ print $1 * 1000 }' "$prefix/lat-$rate.out" | pct 99)" \
            "$n")
    else
        lat="none visible: $(head -c 80 "$prefix/lat-$rate.err")"
    fi
    p99=$(awk '{ print $1 * 1000 }' "$prefix/lat-$rate.out" | pct 99)
    printf '| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f%% | %.1f%% | %d MB | %d | %d | %s |\n' \
        "$rate" "$sent" "$taken" \
        "$(echo "($s1 - $s0 + $d1 - $d0) / $dt" | bc -l)" \
        "$(echo "($p1 - $p0) / $dt" | bc -l)" \
        "$(echo "($l1 - $l0) / $dt" | bc -l)" \
        "$(echo "($c1 - $c0) / $hz / $dt * 100" | bc -l)" \
        "$(echo "($f1 - $f0) / $hz / $dt * 100" | bc -l)" \
        "$mem" $(( g1 - g0 )) $(( x1 - x0 )) "$lat" | tee -a "$prefix/result.md"
    settle
    if perl -e 'exit($ARGV[1] < 0.9 * $ARGV[0] || ($ARGV[2] || 1e9) > 500
                     ? 0 : 1)' "$sent" "$taken" "${p99:-}"; then
        echo "the bridge saturated at $rate batches/s offered" |
            tee -a "$prefix/result.md"
        break
    fi
    if perl -e 'exit($ARGV[1] < 0.9 * $ARGV[0] ? 0 : 1)' "$rate" "$sent"
    then
        echo "the publisher could not send $rate batches/s here" |
            tee -a "$prefix/result.md"
        break
    fi
done

peak=$(awk '$1 == "VmHWM:" { print int($2 / 1024) }' "/proc/$bpid/status")
warns=$(grep -c ' warn: ' "$prefix/logs/kvbridge.log" || true)
{
echo
echo "bridge peak RSS $peak MB; kvbridge.log: $warns warnings (each engine's"
echo "disconnect when the publisher stops between stages is one);"
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
} | tee -a "$prefix/result.md"
