#!/usr/bin/env bash
# What kv_aware_tokenize adds to a request, through nginx, same run.
#
# One nginx (1 worker) in front of kvsim (4 servers, --keyspace tokens,
# simulated time sped up so that a completion costs next to nothing).
# wrk sends the same chat bodies (about 2k tokens, 8 shared system
# prompts) to two locations in turn:
#
#   /text/  upstream kv_aware (keys=text), no tokenize call: the baseline
#   /tok/   upstream kv_aware keys=tokens, kv_aware_tokenize to kvsim's
#           POST /tokenize on loopback (keepalive)
#
# and prints p50 and p99 latency and requests/s of each, and the
# difference: what the tokenize call costs per request.
#
#   bash bench/tokenize.sh [seconds] [connections]
set -euo pipefail

cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-8}
module=$PWD/build/ngx_http_kv_aware_module.so
kvsim=$PWD/build/kvsim
prefix=$PWD/build/bench-tokenize
launch=$PWD/tools/kva-launch
port=$("$launch" port-run 1)
base=$("$launch" port-run 4)

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
[ -x "$kvsim" ] || { echo "build kvsim first: make tools" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: make deps" >&2; exit 1; }

rm -rf "$prefix" && "$launch" prefix "$prefix" >/dev/null

servers=""
for i in 0 1 2 3; do servers="$servers server 127.0.0.1:$((base+i));"; done

KV_AWARE_MODULE=$module "$launch" conf "$prefix" --log-level warn \
    --connections 4096 <<CONF
    client_body_buffer_size 64k;
    proxy_http_version 1.1;
    proxy_set_header Connection "";

    upstream text { kv_aware; $servers keepalive 32; }
    upstream tokens { kv_aware keys=tokens block_tokens=16; $servers
                      keepalive 32; }
    upstream tokenizer { $servers keepalive 32; }

    server {
        listen 127.0.0.1:$port;

        location /text/ { proxy_pass http://text/; }

        location /tok/ {
            kv_aware_tokenize /_tokenize;
            proxy_pass http://tokens/;
        }

        location = /_tokenize {
            internal;
            proxy_pass http://tokenizer/tokenize;
            proxy_set_header Accept-Encoding "";
            proxy_read_timeout 2s;
            subrequest_output_buffer_size 256k;
        }
    }
CONF

# 64 conversations sharing 8 system prompts, about 2k tokens each
# (bench/wrk_bodies.lua)
export BODY_MODEL=kvsim BODY_SYSTEM_WORDS=1900 BODY_USER_WORDS=100 \
       BODY_MAX_TOKENS=1

"$launch" start kvsim "$prefix" "$base" 4 --keyspace tokens --redis off \
    --time-scale 10000 --quiet
"$launch" start nginx "$prefix"
trap '"$launch" stop "$prefix"' EXIT

# "p50 p99 req/s", latencies in ms
run() {
    wrk -t1 -c"$conns" -d"${secs}s" --latency -s bench/wrk_bodies.lua \
        "http://127.0.0.1:$port/$1/v1/chat/completions" | awk '
        function ms(v) {
            if (v ~ /us$/) return v / 1000;
            if (v ~ /ms$/) return v + 0;
            if (v ~ /s$/) return v * 1000;
            return v;
        }
        $1 == "50%" { p50 = ms($2) }
        $1 == "99%" { p99 = ms($2) }
        /Requests\/sec/ { rps = $2 }
        /Non-2xx/ { print "errors " $4 > "/dev/stderr" }
        END { printf "%.3f %.3f %.0f\n", p50, p99, rps }'
}

run text >/dev/null          # warm up both paths and kvsim's cache
run tok >/dev/null

# interleaved rounds, medians: the machine is shared and noisy
texts=() toks=()
for round in 1 2 3; do
    texts+=("$(run text)")
    toks+=("$(run tok)")
done

median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
col() { local c=$1; shift; for r in "$@"; do echo "$r" | cut -d' ' -f"$c"; done; }

tp50=$(median $(col 1 "${texts[@]}")); tp99=$(median $(col 2 "${texts[@]}"))
trps=$(median $(col 3 "${texts[@]}"))
kp50=$(median $(col 1 "${toks[@]}")); kp99=$(median $(col 2 "${toks[@]}"))
krps=$(median $(col 3 "${toks[@]}"))

echo "~2k-token chat bodies, $conns connections, ${secs}s per run,"
echo "1 nginx worker, kvsim on loopback; median of 3 interleaved runs"
echo
echo "| location | p50 ms | p99 ms | requests/s |"
echo "|---|---:|---:|---:|"
echo "| keys=text, no tokenize (baseline) | $tp50 | $tp99 | $trps |"
echo "| keys=tokens + kv_aware_tokenize | $kp50 | $kp99 | $krps |"
awk -v a="$tp50" -v b="$kp50" -v c="$tp99" -v d="$kp99" 'BEGIN {
    printf "\nthe tokenize call adds %.3f ms at p50, %.3f ms at p99\n",
           b - a, d - c }'
