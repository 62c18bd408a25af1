#!/usr/bin/env bash
# nginx's cost of a disaggregated request, mode=header and mode=vllm, next
# to a plain proxied one and an aggregated kv_aware one (issue 20).
#
# One nginx (1 worker) proxies 8k-token chat bodies (bench/wrk_bodies.lua)
# to four trivial upstream servers (another nginx, `return 200`), through
# three locations, wrk driving each in turn:
#
#   plain   proxy_pass to a round-robin upstream, no module
#   kv      proxy_pass to a kv_aware upstream (the aggregated route)
#   split   kv_aware_prefill mode=header min_uncached=0 in front of the
#           same kv_aware upstream: every request split, a prefill server
#           chosen from a second kv_aware upstream and named in
#           x-prefiller-host-port
#   vllm    kv_aware_prefill mode=vllm min_uncached=0: every request split
#           and both legs run by nginx, leg 1 a subrequest to the prefill
#           server (the trivial servers answer it with kv_transfer_params),
#           its params spliced into the decode body
#
# In mode=header the two legs are the decode server's sidecar's: nginx's
# share of a split is the decision and the header.  In mode=vllm nginx
# also sends leg 1, reads its answer and rewrites both bodies.  Prints a markdown table: requests/s and the worker's CPU
# time a request (utime + stime over wrk's count; a loaded machine slows
# the first more than the second), medians of interleaved rounds.
#
#   bash bench/pd_cost.sh [seconds] [connections]     (default 5 16)
#   ROUNDS=5 bash bench/pd_cost.sh                    (default 3)
set -euo pipefail

cd "$(dirname "$0")/.."
secs=${1:-5}
conns=${2:-16}
rounds=${ROUNDS:-3}
module=${KV_AWARE_MODULE:-$PWD/build/ngx_http_kv_aware_module.so}
prefix=$PWD/build/bench-pd-cost
launch=$PWD/tools/kva-launch
port=$("$launch" port-run 5)

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: make deps" >&2; exit 1; }

rm -rf "$prefix" "$prefix-backend"
"$launch" prefix "$prefix" >/dev/null
"$launch" prefix "$prefix-backend" >/dev/null

# the trivial upstreams in an nginx of their own, so that the worker
# measured is the proxy's alone
"$launch" conf "$prefix-backend" --log-level warn --connections 4096 <<CONF
    client_max_body_size 1m;

    server {
        listen 127.0.0.1:$((port+1));
        listen 127.0.0.1:$((port+2));
        listen 127.0.0.1:$((port+3));
        listen 127.0.0.1:$((port+4));
        location / { return 200 '{"ok":true}'; }
        # leg 1's answer, as a vLLM prefill server's with NIXL
        location = /prefill {
            default_type application/json;
            return 200 '{"id":"p","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3,4,5,6,7,8],"remote_engine_id":"e","remote_request_id":"r","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}';
        }
    }
CONF

ups() {
    echo "server 127.0.0.1:$((port+1)); server 127.0.0.1:$((port+2));"
    echo "server 127.0.0.1:$((port+3)); server 127.0.0.1:$((port+4));"
}

"$launch" conf "$prefix" --log-level warn --connections 4096 <<CONF
    client_body_buffer_size 64k;     # 8k-token bodies stay in memory
    client_max_body_size 1m;

    upstream plain { $(ups) keepalive 64; }
    upstream decode { kv_aware; $(ups) keepalive 64; }
    upstream prefill { kv_aware; $(ups) }

    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /plain/ { proxy_pass http://plain/; }
        location /kv/ { proxy_pass http://decode/; }
        location /split/ {
            kv_aware_prefill prefill mode=header min_uncached=0;
            # a proxy_set_header here drops the server's: say it again,
            # or each request opens a connection of its own (+50 us)
            proxy_set_header Connection "";
            proxy_set_header x-prefiller-host-port \$kv_aware_prefill_addr;
            proxy_pass http://decode/;
        }
        location /vllm/ {
            kv_aware_prefill prefill mode=vllm min_uncached=0
                             uri=/_kv_prefill;
            proxy_set_header Connection "";
            proxy_set_header X-Request-Id \$kv_aware_request_id;
            proxy_pass http://decode/;
        }
        location = /_kv_prefill {
            internal;
            proxy_pass http://\$kv_aware_prefill_addr/prefill;
            proxy_set_header X-Request-Id \$kv_aware_request_id;
            subrequest_output_buffer_size 64k;
        }
        location = /status { kv_aware_status; }
    }
CONF

export BODY_MODEL=m BODY_SYSTEM_WORDS=7800 BODY_USER_WORDS=392 \
       BODY_MAX_TOKENS=64

"$launch" start nginx "$prefix-backend" >/dev/null
trap '"$launch" stop "$prefix-backend"' EXIT
"$launch" start nginx "$prefix" >/dev/null
trap '"$launch" stop "$prefix"; "$launch" stop "$prefix-backend"' EXIT

worker=$(pgrep -P "$("$launch" pid "$prefix" nginx)" | head -1)
hz=$(getconf CLK_TCK)
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

LOCS="plain kv split vllm"
for l in $LOCS; do
    run "$l" >/dev/null
done

declare -A rps cpu
for round in $(seq "$rounds"); do
    for l in $LOCS; do
        read -r r c <<<"$(run "$l")"
        rps[$l]+="$r " cpu[$l]+="$c "
    done
done

# every split request must have been split (the status page says so)
splits=$(curl -s "http://127.0.0.1:$port/status" | python3 -c '
import json, sys
d = json.load(sys.stdin)["upstreams"]["decode"]["disaggregated"]["decided"]
print(" ".join("%s %d" % kv for kv in sorted(d.items()) if kv[1]))')

median() { printf '%s\n' $1 | sort -n | sed -n "$(( ($(wc -w <<<"$1") + 1) / 2 ))p"; }

load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "8k-token bodies, $conns connections, ${secs}s a run, 1 nginx worker,"
echo "median of $rounds interleaved rounds; load average before the end:"
echo "$load on $(nproc) CPUs; the decisions: $splits"
echo
echo "| location | requests/s (median) | runs | worker CPU µs a request (median) | runs |"
echo "|---|---|---|---|---|"
for l in $LOCS; do
    echo "| $l | $(median "${rps[$l]}") | ${rps[$l]% } |" \
         "$(median "${cpu[$l]}") | ${cpu[$l]% } |"
done
awk -v p="$(median "${cpu[plain]}")" -v k="$(median "${cpu[kv]}")" \
    -v s="$(median "${cpu[split]}")" -v v="$(median "${cpu[vllm]}")" 'BEGIN {
    printf "\nsplit (mode=header) - plain: %+.1f µs of worker CPU a request", s - p
    printf " (- kv_aware aggregated: %+.1f µs)\n", s - k
    printf "\nsplit (mode=vllm, two legs) - plain: %+.1f µs", v - p
    printf " (- kv_aware aggregated: %+.1f µs)\n", v - k }'
