#!/usr/bin/env bash
# kvbridge: what it costs and how soon nginx sees what an engine stored.
#
#   bash bench/bench_bridge.sh [--quick]
#
#   (1) in process, one core: build/bench_bridge (decode, mirror, encode
#       of vLLM-shaped engine steps).  Goal: 1M engine block hashes/s.
#   (2) through the sockets: an engine (bench/events/bridgebench.pl, vLLM
#       0.26's wire format) floods kvbridge with N engine steps of 64
#       stored and 64 removed blocks; the bridge's CPU time from /proc
#       gives engine hashes per CPU second (ZeroMQ, msgpack-c, the mirror,
#       jansson, hiredis).  Goal: 1M/s.
#   (3) publish-to-visible through the bridge: K times, the engine
#       publishes a BlockStored of a new prompt's token ids, and a client
#       requests that prompt ({"prompt": [ids]}) through nginx (keys=tokens)
#       back to back until nginx routes it with X-KV-Matched > 0.  Latency
#       = first matching answer - the publish (one request round trip
#       included).  Goal: p99 <= 5 ms.
#
# One nginx worker, three trivial upstream servers, one redis-server, one
# kvbridge, all on 127.0.0.1 under build/bench-bridge/; everything stops on
# exit.  Bench-only nginx settings as in bench/bench_events.sh (a flood is
# not a flood here).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
quick=0
[ "${1:-}" = "--quick" ] && quick=1

N=$(( quick ? 2000 : 10000 ))     # (2) engine steps
K=$(( quick ? 50 : 300 ))         # (3) probes
MODEL=bench-model

module=$root/build/ngx_http_kv_aware_module.so
prefix=$root/build/bench-bridge
launch=$root/tools/kva-launch

for f in "$module" "$root/build/kvbridge" "$root/build/bench_bridge"; do
    [ -x "$f" ] || [ -f "$f" ] || { echo "$f missing: make module tools" \
        "$root/build/bench_bridge" >&2; exit 1; }
done

echo "== (1) kvbridge in process, one core" >&2
"$root/build/bench_bridge"

rm -rf "$prefix"
"$launch" prefix "$prefix" >/dev/null
read -r port b1 b2 b3 rport zmq < <("$launch" ports 6)

cleanup() {
    set +e
    "$launch" stop "$prefix"
}
trap cleanup EXIT INT TERM

"$launch" start redis "$prefix" "$rport" \
    --client-output-buffer-limit pubsub 0 0 0

KV_AWARE_MODULE=$module "$launch" conf "$prefix" --log-level notice \
    --connections 4096 <<EOF
    client_body_buffer_size 64k;

    upstream llm {
        kv_aware keys=tokens block_tokens=16 index_size=256m;
        kv_aware_events redis=127.0.0.1:$rport heartbeat=3600s
                        speculative_ttl=10ms max_rate=1000000
                        server_bytes=512m server_hashes=100000000;
        server 127.0.0.1:$b1;
        server 127.0.0.1:$b2;
        server 127.0.0.1:$b3;
        keepalive 32;
    }

    server {
        listen 127.0.0.1:$port;
        keepalive_requests 1000000;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location / {
            proxy_pass http://llm;
            add_header X-KV-Matched \$kv_aware_matched;
        }
    }

    server {
        listen 127.0.0.1:$b1;
        listen 127.0.0.1:$b2;
        listen 127.0.0.1:$b3;
        location / { return 200 '{"ok":true}'; }
    }
EOF
"$launch" start nginx "$prefix"

"$launch" start kvbridge "$prefix" --redis "127.0.0.1:$rport" \
    --engine "127.0.0.1:$b2 model=$MODEL events=tcp://127.0.0.1:$zmq" \
    --heartbeat 60000
bpid=$("$launch" pid "$prefix" kvbridge)

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

echo "== (2) flood: $N engine steps of 64 + 64 blocks through kvbridge" >&2
c0=$(ticks "$bpid")
t0=$(date +%s.%N)
if [ -n "${KVB_PERF:-}" ]; then
    perf record -g -o "$prefix/perf.data" -p "$bpid" -- sleep 6 \
        >/dev/null 2>&1 &
fi
sent=$(perl "$root/bench/events/bridgebench.pl" flood --zmq "$zmq" \
       --model "$MODEL" --batches "$N" --blocks 64)
# the bridge is done when its CPU stops moving
prev=-1
for _ in $(seq 100); do
    c=$(ticks "$bpid")
    [ "$c" = "$prev" ] && break
    prev=$c
    sleep 0.2
done
c1=$(ticks "$bpid")
cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN { print (b - a) / hz }')
rate=$(awk -v n="$sent" -v c="$cpu" 'BEGIN { print (c > 0) ? n / c : 0 }')

echo "== (3) publish-to-visible, $K probes" >&2
"$launch" stop "$prefix" kvbridge
"$launch" start kvbridge "$prefix" --redis "127.0.0.1:$rport" \
    --engine "127.0.0.1:$b2 model=$MODEL events=tcp://127.0.0.1:$zmq" \
    --heartbeat 60000
lat=$(perl "$root/bench/events/bridgebench.pl" latency --zmq "$zmq" \
      --port "$port" --model "$MODEL" --count "$K" | sort -n)
p50=$(echo "$lat" | awk -v k="$K" 'NR == int(k * 0.5 + 0.5) { print $1 * 1000 }')
p99=$(echo "$lat" | awk -v k="$K" 'NR == int(k * 0.99 + 0.5) { print $1 * 1000 }')
reqs=$(echo "$lat" | awk '{ n += $2 } END { printf "%.1f", n / NR }')

echo
echo "| kvbridge | goal | measured | met |"
echo "|---|---|---|---|"
awk -v r="$rate" -v n="$sent" -v c="$cpu" -v p50="$p50" -v p99="$p99" \
    -v q="$reqs" 'BEGIN {
    printf "| (2) engine hashes per CPU second, through the sockets | >= 1M | %.2fM (%d hashes, %.2f s CPU) | %s |\n", r / 1e6, n, c, (r >= 1e6) ? "yes" : "no"
    printf "| (3) publish-to-visible p50 | - | %.2f ms | |\n", p50
    printf "| (3) publish-to-visible p99 | <= 5 ms | %.2f ms (%s requests a probe) | %s |\n", p99, q, (p99 <= 5) ? "yes" : "no"
}'
