#!/usr/bin/env bash
# Through nginx: kv_aware against plain round-robin, same run, same body.
#
# One nginx (1 worker) proxies 8k-token chat bodies to four trivial
# upstream servers (nginx itself, `return 200`); wrk drives each upstream
# in turn.  Prints requests/s and the kv_aware / round-robin ratio, and
# the worker's CPU time per request (utime + stime over wrk's count): a
# run that other work on a shared machine slowed shows in its requests/s
# but hardly in its CPU time per request, so the two ratios side by side
# tell noise from cost.
#
#   bash bench/wrk.sh [seconds] [connections]
#   ROUNDS=5 bash bench/wrk.sh      more interleaved rounds (default 3)
set -euo pipefail

cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-32}
rounds=${ROUNDS:-3}
module=${KV_AWARE_MODULE:-$PWD/build/ngx_http_kv_aware_module.so}
prefix=$PWD/build/bench-wrk
launch=$PWD/tools/kva-launch
# nginx and the four trivial upstreams on consecutive ports
port=$("$launch" port-run 5)

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: make deps" >&2; exit 1; }

rm -rf "$prefix" && "$launch" prefix "$prefix" >/dev/null

"$launch" conf "$prefix" --log-level warn \
    --connections 4096 <<CONF
    client_body_buffer_size 64k;     # 8k-token bodies stay in memory
    client_max_body_size 1m;

    upstream rr {
        server 127.0.0.1:$((port+1)); server 127.0.0.1:$((port+2));
        server 127.0.0.1:$((port+3)); server 127.0.0.1:$((port+4));
        keepalive 64;
    }

    upstream kv {
        kv_aware;
        server 127.0.0.1:$((port+1)); server 127.0.0.1:$((port+2));
        server 127.0.0.1:$((port+3)); server 127.0.0.1:$((port+4));
        keepalive 64;
    }

    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /rr/ { proxy_pass http://rr/; }
        location /kv/ { proxy_pass http://kv/; }
    }

    server {
        listen 127.0.0.1:$((port+1));
        listen 127.0.0.1:$((port+2));
        listen 127.0.0.1:$((port+3));
        listen 127.0.0.1:$((port+4));
        location / { return 200 '{"ok":true}'; }
    }
CONF

# 64 conversations sharing 8 system prompts, ~8k tokens each
# (bench/wrk_bodies.lua)
export BODY_MODEL=m BODY_SYSTEM_WORDS=7800 BODY_USER_WORDS=392 \
       BODY_MAX_TOKENS=64

"$launch" start nginx "$prefix"
trap '"$launch" stop "$prefix"' EXIT
[ -n "${KEEP_NGINX:-}" ] && trap - EXIT

worker=$(pgrep -P "$("$launch" pid "$prefix" nginx)" | head -1)
hz=$(getconf CLK_TCK)

# the worker's utime + stime, in clock ticks
ticks() { awk '{ print $14 + $15 }' "/proc/$worker/stat"; }

# prints "requests/s CPU-microseconds-a-request"
run() {
    local t0 t1 out
    t0=$(ticks)
    out=$(wrk -t1 -c"$conns" -d"${secs}s" -s bench/wrk_bodies.lua \
              "http://127.0.0.1:$port/$1/v1/chat/completions")
    t1=$(ticks)
    awk -v t="$((t1 - t0))" -v hz="$hz" '
        / requests in / { n = $1 }
        /Requests\/sec/ { rps = $2 }
        /Non-2xx/ { print "errors " $4 > "/dev/stderr" }
        END { printf "%s %.1f\n", rps, n ? t * 1e6 / hz / n : 0 }' <<<"$out"
}

run rr >/dev/null            # warm up both paths once
run kv >/dev/null

# interleaved rounds, medians: the machine is shared and noisy
rrs=() kvs=() rrc=() kvc=()
for round in $(seq "$rounds"); do
    read -r r c <<<"$(run rr)"
    rrs+=("$r") rrc+=("$c")
    read -r r c <<<"$(run kv)"
    kvs+=("$r") kvc+=("$c")
done

median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
least() { printf '%s\n' "$@" | sort -n | head -1; }
rr=$(median "${rrs[@]}")
kv=$(median "${kvs[@]}")
rrcpu=$(median "${rrc[@]}")
kvcpu=$(median "${kvc[@]}")

echo "8k-token bodies, $conns connections, ${secs}s per run, 1 nginx worker,"
echo "median of $rounds interleaved runs"
echo
printf '%s\n' "| upstream | requests/s (median) | runs |"\
" worker CPU µs a request (median) | runs |"
echo "|---|---|---|---|---|"
echo "| round-robin | $rr | ${rrs[*]} | $rrcpu | ${rrc[*]} |"
echo "| kv_aware | $kv | ${kvs[*]} | $kvcpu | ${kvc[*]} |"
awk -v kv="$kv" -v rr="$rr" -v kc="$kvcpu" -v rc="$rrcpu" \
    -v kl="$(least "${kvc[@]}")" -v rl="$(least "${rrc[@]}")" 'BEGIN {
    printf "\nkv_aware / round-robin: %.3f (goal >= 0.9)\n", kv / rr
    printf "by CPU time a request: %.3f (round-robin %s µs, kv_aware %s µs)\n",
           rc / kc, rc, kc
    printf "by the least CPU time of each: %.3f (%s µs, %s µs)\n",
           rl / kl, rl, kl }'
