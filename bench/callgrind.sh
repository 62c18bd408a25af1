#!/usr/bin/env bash
# Instructions a request through nginx, round-robin against kv_aware:
# what bench/wrk.sh times, counted instead, so that a loaded machine
# cannot move the figure.
#
# nginx (one process, master_process off) runs under valgrind's callgrind
# with bench/wrk.sh's configuration; curl sends 16 of wrk's 8k-token
# bodies (bench/wrk_bodies.lua, written out by the same rule) to warm up,
# then 64 with collection on, one upstream at a time.  Prints the
# instructions a request of each, their difference, and the functions
# that take most of kv_aware's.  About a minute.
#
#   bash bench/callgrind.sh
#   KV_AWARE_MODULE=/path/to/ngx_http_kv_aware_module.so bash bench/callgrind.sh
set -euo pipefail

cd "$(dirname "$0")/.."
module=${KV_AWARE_MODULE:-$PWD/build/ngx_http_kv_aware_module.so}
nginx=${NGINX:-/usr/sbin/nginx}
launch=$PWD/tools/kva-launch
prefix=$PWD/build/bench-callgrind
requests=64

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is missing" >&2; exit 1; }

rm -rf "$prefix" && "$launch" prefix "$prefix" >/dev/null
mkdir -p "$prefix/bodies"

# bench/wrk_bodies.lua's 64 bodies, byte for byte
perl -e '
    sub words { my ($s, $n) = @_; join "", map {
        chr(97 + ($s * 7 + $_ * 13) % 26) . chr(97 + ($s * 11 + $_ * 5) % 26)
        . chr(97 + ($_ * 3 + $s) % 26) . " " } 1 .. $n }
    for my $c (1 .. 64) {
        open my $f, ">", "$ARGV[0]/$c.json" or die "$!\n";
        print $f q({"model":"m","messages":[{"role":"system","content":")
            . words($c % 8, 7800) . q("},{"role":"user","content":")
            . words(1000 + $c, 392) . q("}],"max_tokens":64});
    }' "$prefix/bodies"

port=$("$launch" port-run 5)
servers="server 127.0.0.1:$((port+1)); server 127.0.0.1:$((port+2));
        server 127.0.0.1:$((port+3)); server 127.0.0.1:$((port+4));"

KV_AWARE_MODULE=$module "$launch" conf "$prefix" --log-level warn <<CONF
    client_body_buffer_size 64k;
    client_max_body_size 1m;
    upstream rr { $servers keepalive 64; }
    upstream kv { kv_aware; $servers keepalive 64; }
    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /rr/ { proxy_pass http://rr/; }
        location /kv/ { proxy_pass http://kv/; }
    }
    server {
        listen 127.0.0.1:$((port+1)); listen 127.0.0.1:$((port+2));
        listen 127.0.0.1:$((port+3)); listen 127.0.0.1:$((port+4));
        location / { return 200 '{"ok":true}'; }
    }
CONF

vg=
trap '[ -n "$vg" ] && kill "$vg" 2>/dev/null; true' EXIT

send() {    # upstream, first body, last body
    local c code
    for c in $(seq "$2" "$3"); do
        code=$(curl -s -o /dev/null -w '%{http_code}' \
                    -H 'Content-Type: application/json' \
                    --data-binary "@$prefix/bodies/$c.json" \
                    "http://127.0.0.1:$port/$1/v1/chat/completions")
        [ "$code" = 200 ] || { echo "$1: HTTP $code" >&2; exit 1; }
    done
}

# prints the instructions a request of one upstream
count() {
    local out=$prefix/callgrind.$1 i
    valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$out" "$nginx" -p "$prefix" \
        -c "$prefix/conf/nginx.conf" \
        -g 'master_process off; daemon off;' 2>"$prefix/logs/valgrind.$1" &
    vg=$!

    for i in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && break
        sleep 0.3
    done

    send "$1" 1 16
    callgrind_control -i on "$vg" >/dev/null 2>&1
    send "$1" 1 "$requests"
    callgrind_control -i off "$vg" >/dev/null 2>&1
    kill "$vg" && wait "$vg" || true
    vg=

    callgrind_annotate "$out" 2>/dev/null \
        | awk -v n="$requests" '/PROGRAM TOTALS/ && !t {
              gsub(",", "", $1); t = $1 } END { printf "%d\n", t / n }'
}

rr=$(count rr)
kv=$(count kv)

echo "instructions a request, 8k-token bodies, $requests requests each"
echo
echo "| upstream | instructions a request |"
echo "|---|---:|"
echo "| round-robin | $rr |"
echo "| kv_aware | $kv |"
echo "| what kv_aware adds | $((kv - rr)) |"
echo
echo "kv_aware's most costly functions (instructions a request):"
callgrind_annotate "$prefix/callgrind.kv" 2>/dev/null \
    | awk -v n="$requests" '/^ *[0-9,]+ .*:/ && !/PROGRAM TOTALS/ {
          c = $1; gsub(",", "", c); f = $NF ~ /^\[/ ? $(NF-1) : $NF
          sub(/.*:/, "", f)
          if (++k <= 12) printf "  %-40s %8d\n", f, c / n }'
