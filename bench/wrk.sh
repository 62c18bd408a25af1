#!/usr/bin/env bash
# Through nginx: kv_aware against plain round-robin, same run, same body.
#
# One nginx (1 worker) proxies 8k-token chat bodies to four trivial
# upstream servers (nginx itself, `return 200`); wrk drives each upstream
# in turn.  Prints requests/s and the kv_aware / round-robin ratio.
#
#   bash bench/wrk.sh [seconds] [connections]
set -euo pipefail

cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-32}
module=${KV_AWARE_MODULE:-$PWD/build/ngx_http_kv_aware_module.so}
prefix=$PWD/build/bench-wrk
launch=$PWD/tools/kva-launch
# nginx and the four trivial upstreams on consecutive ports
port=$("$launch" port-run 5)

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: make deps" >&2; exit 1; }

rm -rf "$prefix" && "$launch" prefix "$prefix" >/dev/null
user=""
[ "$(id -u)" -eq 0 ] && user="user root;"

cat > "$prefix/conf/nginx.conf" <<CONF
load_module $module;
$user
worker_processes 1;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_buffer_size 64k;     # 8k-token bodies stay in memory
    client_max_body_size 1m;
    client_body_temp_path $prefix/body;
    proxy_temp_path $prefix/proxy;

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
}
CONF

# 64 conversations sharing 8 system prompts, ~8k tokens each
cat > "$prefix/body.lua" <<'LUA'
local bodies = {}
local function words(seed, n)
    local t = {}
    for i = 1, n do
        t[i] = string.char(97 + (seed * 7 + i * 13) % 26,
                           97 + (seed * 11 + i * 5) % 26,
                           97 + (i * 3 + seed) % 26, 32)
    end
    return table.concat(t)
end
for c = 1, 64 do
    bodies[c] = '{"model":"m","messages":[{"role":"system","content":"'
        .. words(c % 8, 7800) .. '"},{"role":"user","content":"'
        .. words(1000 + c, 392) .. '"}],"max_tokens":64}'
end
local n = 0
request = function()
    n = n + 1
    return wrk.format("POST", nil, {["Content-Type"] = "application/json"},
                      bodies[n % 64 + 1])
end
LUA

"$launch" start nginx "$prefix"
trap '"$launch" stop "$prefix"' EXIT
[ -n "${KEEP_NGINX:-}" ] && trap - EXIT

run() {
    wrk -t1 -c"$conns" -d"${secs}s" -s "$prefix/body.lua" \
        "http://127.0.0.1:$port/$1/v1/chat/completions" \
        | awk '/Requests\/sec/ {print $2} /Non-2xx/ {print "errors " $4 > "/dev/stderr"}'
}

run rr >/dev/null            # warm up both paths once
run kv >/dev/null

# interleaved rounds, medians: the machine is shared and noisy
rrs=() kvs=()
for round in 1 2 3; do
    rrs+=("$(run rr)")
    kvs+=("$(run kv)")
done

median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
rr=$(median "${rrs[@]}")
kv=$(median "${kvs[@]}")

echo "8k-token bodies, $conns connections, ${secs}s per run, 1 nginx worker,"
echo "median of 3 interleaved runs"
echo
echo "| upstream | requests/s (median) | runs |"
echo "|---|---|---|"
echo "| round-robin | $rr | ${rrs[*]} |"
echo "| kv_aware | $kv | ${kvs[*]} |"
awk -v kv="$kv" -v rr="$rr" \
    'BEGIN { printf "\nkv_aware / round-robin: %.3f (goal >= 0.9)\n", kv / rr }'
