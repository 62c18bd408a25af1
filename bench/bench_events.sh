#!/usr/bin/env bash
# Precise mode (kv_aware_events) through a real nginx and a real Redis.
#
#   bash bench/bench_events.sh [--quick] [--ranks R]
#
# One nginx, ONE worker (it holds the subscription and routes every request,
# so whatever events cost shows in routing: the worst case), three trivial
# upstream servers (nginx itself, `return 200`), one redis-server, all on
# 127.0.0.1 under build/bench-events/; everything is stopped on exit.
#
#   (1) ingest: N messages of 64 fresh hashes each, written to Redis at once
#       by `redis-cli --pipe`, and last a sentinel message that stores the
#       block hashes of a probe prompt on another server.  Messages are
#       applied in order, so when a client that requests the probe prompt
#       every millisecond first sees X-KV-Matched > 0, all N were applied.
#       Rate = N x 64 / (sentinel visible - start of the pipe): the hashes
#       the subscribing worker applied per second, Redis and JSON included.
#   (2) publish-to-visible: while a stream of 10,000 messages/s (one
#       "stored" event of 8 fresh hashes each) runs for another server, a
#       client K times publishes a "stored" event for the blocks of a new
#       prompt, then requests that prompt back to back until nginx routes
#       it with X-KV-Matched > 0.  Latency = first matching response - start
#       of the PUBLISH (so it includes one request round trip: the floor is
#       shown).  Nothing but events can make it match: every server is
#       fresh (routing trusts only events there) and speculative_ttl=10ms is
#       under the 16 ms index tick, so speculative entries never count.
#   (3) routing latency: wrk, 1 connection, 8 KB chat bodies, each run 5 s,
#       (a) the same 10k messages/s stream published on a channel nginx does
#       not subscribe to (same Redis and publisher CPU, no module work) and
#       (b) on kv_aware:events; interleaved a, b, a, b, a, b.  Goal: median
#       latency of (b) within 10% of (a).
#
# --ranks R: the three servers are data_parallel=R (R=341: 1,023 ranks,
# the most three servers have under the limit of 1,024), every rank made
# fresh by a heartbeat first, and (1) only: its messages go to S2's
# ranks in turn, each found by (server, rank) in the zone's name table;
# the sentinel to S1's rank 0.
#
# Bench-only settings: max_rate=1000000 (the default 20000 messages/s would
# cut (1) short), server_bytes=512m server_hashes=100000000 (one server
# publishes (1) at about 1.9 million hashes/s, 36 MB/s: twice the default
# budget of 1,000,000 hashes/s, which a real server never needs), index_size=256m (no eviction in (1)), heartbeat=3600s,
# and Redis' pubsub output buffer limit off (a lagging subscriber is not
# dropped).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
quick=0
ranks=0
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=1 ;;
        --ranks) ranks=$2; shift ;;
        *) echo "usage: $0 [--quick] [--ranks R]" >&2; exit 1 ;;
    esac
    shift
done
dp=""
[ "$ranks" -gt 0 ] && dp="data_parallel=$ranks"

N=$(( quick ? 4000 : 20000 ))     # (1) messages of 64 hashes
K=$(( quick ? 100 : 300 ))        # (2) probes
RUN=$(( quick ? 2 : 5 ))          # (3) seconds per wrk run
RATE=10000                        # (2)(3) event messages/s
EVH=8                             # (2)(3) hashes per message

module=${KV_AWARE_MODULE:-$root/build/ngx_http_kv_aware_module.so}
prefix=$root/build/bench-events
ev="perl $root/bench/events/evbench.pl"

[ -f "$module" ] || { echo "build the module first: make module" >&2; exit 1; }
for b in nginx redis-server redis-cli wrk gcc perl; do
    command -v $b >/dev/null || { echo "$b is missing" >&2; exit 1; }
done

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$prefix"
launch=$root/tools/kva-launch       # nginx and redis as the tests run them
"$launch" prefix "$prefix" >/dev/null

# free loopback ports: nginx, 3 backends, redis
read -r port b1 b2 b3 rport < <("$launch" ports 5)

pids=()
cleanup() {
    set +e
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    "$launch" stop "$prefix"        # nginx, then redis
    wait 2>/dev/null
}
trap cleanup EXIT INT TERM

# --- redis: log in logs/redis.log ------------------------------------------
"$launch" start redis "$prefix" "$rport" \
    --client-output-buffer-limit pubsub 0 0 0
rcli() { redis-cli -p "$rport" "$@"; }

# --- the module's hasher, for the probe prompts --------------------------------
make -s --no-print-directory "$root/build/kva_hashes"
cp build/kva_hashes "$prefix/kva_hashes"

# --- nginx -------------------------------------------------------------------
KV_AWARE_MODULE=$module "$launch" conf "$prefix" --log-level notice \
    --connections 4096 <<EOF
    client_body_buffer_size 64k;

    upstream llm {
        kv_aware index_size=256m $dp;
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
        location = /kv_status { kv_aware_status; }
    }

    server {
        listen 127.0.0.1:$b1;
        listen 127.0.0.1:$b2;
        listen 127.0.0.1:$b3;
        location / { return 200 '{"ok":true}'; }
    }
EOF
"$launch" start nginx "$prefix"
for _ in $(seq 50); do
    [ "$(rcli pubsub numsub kv_aware:events | tail -1)" = 1 ] && break
    sleep 0.1
done
[ "$(rcli pubsub numsub kv_aware:events | tail -1)" = 1 ] ||
    { echo "nginx did not subscribe" >&2; tail "$prefix/logs/error.log"; exit 1; }

S1=127.0.0.1:$b1; S2=127.0.0.1:$b2; S3=127.0.0.1:$b3
status() { curl -s "http://127.0.0.1:$port/kv_status" 2>/dev/null ||
           perl -MIO::Socket::INET -e '
               my $s = IO::Socket::INET->new("127.0.0.1:'"$port"'") or die;
               print $s "GET /kv_status HTTP/1.0\r\n\r\n"; local $/;
               print((split /\r\n\r\n/, <$s>, 2)[1])'; }
jget() { perl -MJSON::PP -e '
    my $j = decode_json(join "", <STDIN>)->{upstreams}{llm};
    for (split /\./, $ARGV[0]) { $j = /^\d+$/ ? $j->[$_] : $j->{$_} }
    print $j // "", "\n"' "$1"; }

# every server fresh (a heartbeat each), so that routing trusts only
# events: b1 and b3 at seq 1, b2 at seq 0 (its seq 1.. are (1)'s messages)
if [ "$ranks" -gt 0 ]; then
    # every rank at seq 0; the sentinel is then S1 rank 0's seq 1
    $ev gen-fresh --out "$prefix/fresh.resp" --server "$S1,$S2,$S3" \
        --ranks "$ranks"
    redis-cli -p "$rport" --pipe < "$prefix/fresh.resp" > /dev/null
    for _ in $(seq 100); do
        [ "$(status | jget events.messages)" = $(( 3 * ranks )) ] && break
        sleep 0.1
    done
    [ "$(status | jget events.messages)" = $(( 3 * ranks )) ] ||
        { echo "not every rank took its heartbeat" >&2; exit 1; }
else
for m in "$S1\",\"seq\":1" "$S2\",\"seq\":0" "$S3\",\"seq\":1"; do
    rcli publish kv_aware:events "{\"v\":1,\"server\":\"$m}" >/dev/null
done
for _ in $(seq 50); do
    [ "$(status | jget servers.1.state)" = fresh ] && break
    sleep 0.1
done
fi

# =========================================================================
echo "== (1) ingest: $N messages x 64 hashes, redis-cli --pipe" >&2
perl -e 'my $t = ""; my $i = 0;
         $t .= "[ingest-probe/" . $i++ . "] the sentinel prompt. "
             while length $t < 1024;
         print qq({"model":"bench","messages":[{"role":"user","content":"$t"}]})' \
    > "$prefix/probe.json"
sentinel=$("$prefix/kva_hashes" 256 < "$prefix/probe.json" | paste -sd,)
$ev gen-ingest --out "$prefix/ingest.resp" --messages "$N" --hashes 64 \
    --server "$S2" --sentinel-server "$S1" --sentinel "$sentinel" \
    ${dp:+--ranks "$ranks"}

before=$(status | jget events.hashes)
[ "$before" = 0 ] || { echo "unexpected: $before hashes before (1)" >&2; exit 1; }
$ev probe --port "$port" --body "$prefix/probe.json" --timeout 60 \
    > "$prefix/probe.out" &
probe_pid=$!
sleep 0.2                     # the probe client is polling
t0=$(perl -MTime::HiRes=time -e 'printf "%.6f", time')
redis-cli -p "$rport" --pipe < "$prefix/ingest.resp" > "$prefix/pipe.out"
t_pipe=$(perl -MTime::HiRes=time -e 'printf "%.6f", time')
wait $probe_pid
t1=$(cat "$prefix/probe.out")
st=$(status)
applied=$(echo "$st" | jget events.hashes)
rejected=$(echo "$st" | perl -MJSON::PP -e '
    my $r = decode_json(join "", <STDIN>)->{upstreams}{llm}{events}{rejected};
    my $n = 0; $n += $_ for values %$r; print $n')
nsent=$(echo "$sentinel" | tr ',' '\n' | wc -l)
want=$(( N * 64 + nsent ))
[ "$applied" = "$want" ] && [ "$rejected" = 0 ] || {
    echo "(1) status says $applied hashes applied, $rejected rejected;" \
         "expected $want, 0" >&2; exit 1; }
ingest=$(perl -e 'printf "%.0f", $ARGV[0] * 64 / ($ARGV[2] - $ARGV[1])' \
         "$N" "$t0" "$t1")
pipe_rate=$(perl -e 'printf "%.0f", $ARGV[0] * 64 / ($ARGV[2] - $ARGV[1])' \
            "$N" "$t0" "$t_pipe")
printf '   %s hashes applied (status agrees), %s hashes/s; redis-cli alone wrote %s hashes/s\n' \
       "$applied" "$ingest" "$pipe_rate" >&2

if [ "$ranks" -gt 0 ]; then
    printf '   %s ranks in the upstream, messages to %s of them; load before: %s, after: %s\n' \
           $(( 3 * ranks )) "$ranks" "$load0" \
           "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
    exit 0
fi

# =========================================================================
pct() {    # pct P < numbers  (nearest rank)
    sort -g | awk -v p="$1" '{ a[NR] = $1 } END {
        i = int(NR * p / 100 + 0.999999); if (i < 1) i = 1; print a[i] }'; }

latency_run() {     # latency_run LABEL: K probes, prints ms lines to a file
    $ev latency --redis "$rport" --port "$port" --server "$S1" \
        --hasher "$prefix/kva_hashes" --block-size 256 --count "$K" \
        --tag "$1" > "$prefix/lat-$1.out"
}

echo "== (2) publish-to-visible, $K probes, idle then under $RATE msg/s" >&2
latency_run idle
$ev stream --redis "$rport" --server "$S2" --rate "$RATE" --hashes "$EVH" \
    --seconds 60 > "$prefix/stream-2.out" &
stream_pid=$!; pids+=("$stream_pid")
sleep 0.5
m0=$(status | jget events.messages)
t_a=$(perl -MTime::HiRes=time -e 'printf "%.6f", time')
latency_run loaded
t_b=$(perl -MTime::HiRes=time -e 'printf "%.6f", time')
m1=$(status | jget events.messages)
kill "$stream_pid"; wait "$stream_pid" 2>/dev/null || true
evrate=$(perl -e 'printf "%.0f", ($ARGV[1] - $ARGV[0]) / ($ARGV[3] - $ARGV[2])' \
         "$m0" "$m1" "$t_a" "$t_b")
for r in idle loaded; do
    eval "${r}_p50=\$(awk '{print \$1*1000}' $prefix/lat-$r.out | pct 50)"
    eval "${r}_p99=\$(awk '{print \$1*1000}' $prefix/lat-$r.out | pct 99)"
    eval "${r}_max=\$(awk '{print \$1*1000}' $prefix/lat-$r.out | pct 100)"
    eval "${r}_req=\$(awk '{print \$2}' $prefix/lat-$r.out | pct 50)"
done
printf '   idle:   p50 %.3f ms, p99 %.3f ms, max %.3f ms\n' \
       "$idle_p50" "$idle_p99" "$idle_max" >&2
printf '   loaded: p50 %.3f ms, p99 %.3f ms, max %.3f ms (%s msg/s applied meanwhile)\n' \
       "$loaded_p50" "$loaded_p99" "$loaded_max" "$evrate" >&2

# =========================================================================
echo "== (3) routing latency, wrk -c1, ${RUN}s runs" >&2
cat > "$prefix/body.lua" <<'LUA'
local bodies = {}
for c = 1, 16 do
    local t = {}
    for i = 1, 2000 do
        t[i] = string.char(97 + (c * 7 + i * 13) % 26, 97 + (i * 3 + c) % 26, 32, 32)
    end
    bodies[c] = '{"model":"m","messages":[{"role":"system","content":"'
        .. table.concat(t) .. '"},{"role":"user","content":"q' .. c .. '"}]}'
end
local n = 0
request = function()
    n = n + 1
    return wrk.format("POST", "/v1/chat/completions",
                      {["Content-Type"] = "application/json"}, bodies[n % 16 + 1])
end
LUA

to_us() {  # "123.45us" | "1.23ms" | "1.00s" -> microseconds
    perl -e '$_ = shift; /^([\d.]+)(us|ms|s)$/ or die "bad $_";
             printf "%.1f", $1 * {us => 1, ms => 1e3, s => 1e6}->{$2}' "$1"; }

wrk_run() {   # wrk_run LABEL CHANNEL|none
    local label=$1 ch=$2 sp=""
    if [ "$ch" != none ]; then
        $ev stream --redis "$rport" --server "$S2" --rate "$RATE" \
            --hashes "$EVH" --seconds $(( RUN + 2 )) --channel "$ch" \
            > "$prefix/stream-$label.out" &
        sp=$!; pids+=("$sp")
        sleep 0.5
    fi
    wrk -t1 -c1 -d"${RUN}s" --latency -s "$prefix/body.lua" \
        "http://127.0.0.1:$port" > "$prefix/wrk-$label.out"
    [ -n "$sp" ] && { kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true; }
    local f=$prefix/wrk-$label.out
    if grep -q 'Non-2xx\|Socket errors' "$f"; then
        echo "wrk errors in $label:" >&2; cat "$f" >&2; exit 1
    fi
    echo "$(to_us "$(awk '/^    Latency/ {print $2}' "$f")")" \
         "$(to_us "$(awk '/^ +50%/ {print $2}' "$f")")" \
         "$(to_us "$(awk '/^ +99%/ {print $2}' "$f")")" \
         "$(awk '/^Requests\/sec/ {print $2}' "$f")"
}

PAIRS=$(( quick ? 2 : 3 ))
wrk_run warm none > /dev/null
read -r idle_avg idle_w50 idle_w99 idle_rps < <(wrk_run idle none)
: > "$prefix/wrk-ctl.txt"; : > "$prefix/wrk-ev.txt"
for i in $(seq "$PAIRS"); do
    wrk_run "ctl$i" kv_aware:bench-null >> "$prefix/wrk-ctl.txt"
    wrk_run "ev$i" kv_aware:events >> "$prefix/wrk-ev.txt"
done
mean_col() { awk -v c="$2" '{ s += $c } END { printf "%.1f", s / NR }' "$1"; }
read -r ctl_avg ctl_50 ctl_99 ctl_rps < <(for c in 1 2 3 4; do
    mean_col "$prefix/wrk-ctl.txt" $c; printf ' '; done; echo)
read -r ev_avg ev_50 ev_99 ev_rps < <(for c in 1 2 3 4; do
    mean_col "$prefix/wrk-ev.txt" $c; printf ' '; done; echo)
ratio50=$(perl -e 'printf "%.3f", $ARGV[1] / $ARGV[0]' "$ctl_50" "$ev_50")
ratio=$(perl -e 'printf "%.3f", $ARGV[1] / $ARGV[0]' "$ctl_avg" "$ev_avg")

# sanity: nothing rejected, nginx healthy
st=$(status)
[ "$(echo "$st" | jget redis.state)" = up ] || { echo "redis link not up" >&2; exit 1; }
if grep -E '\[(alert|crit|emerg)\]|exited on signal' "$prefix/logs/error.log" >&2; then
    echo "nginx logged errors" >&2; exit 1
fi

# =========================================================================
ok() { perl -e 'print $ARGV[0] ? "yes" : "**no**"' "$1"; }
echo
echo "kv_aware precise mode, 1 nginx worker, $(nproc) cores, loopback;" \
     "event load = $RATE messages/s x $EVH hashes;" \
     "load average $load0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo
echo "| metric | goal | measured | met |"
echo "|---|---|---|---|"
printf '| (1) hashes applied/s by the subscribing worker (%d x 64 via redis-cli --pipe) | >= 500,000 | %s | %s |\n' \
       "$N" "$ingest" "$(ok "$(( ingest >= 500000 ))")"
printf '| (2) publish-to-visible p50 under load | - | %.2f ms | |\n' "$loaded_p50"
printf '| (2) publish-to-visible p99 under load | <= 5 ms | %.2f ms | %s |\n' \
       "$loaded_p99" "$(ok "$(perl -e 'print $ARGV[0] <= 5 ? 1 : 0' "$loaded_p99")")"
printf '| (2) publish-to-visible p50 / p99 idle | - | %.2f / %.2f ms | |\n' \
       "$idle_p50" "$idle_p99"
printf '| (3) routing latency p50, events vs control | within 10%% | %s vs %s us (x%s) | %s |\n' \
       "$ev_50" "$ctl_50" "$ratio50" \
       "$(ok "$(perl -e 'print $ARGV[0] <= 1.10 ? 1 : 0' "$ratio50")")"
printf '| (3) routing latency mean, events vs control | - | %s vs %s us (x%s) | |\n' \
       "$ev_avg" "$ctl_avg" "$ratio"
printf '| (3) routing latency p50 / p99, events | - | %s / %s us | |\n' "$ev_50" "$ev_99"
printf '| (3) routing latency p50 / p99, control | - | %s / %s us | |\n' "$ctl_50" "$ctl_99"
printf '| (3) no stream at all: mean / p50 / p99 | - | %s / %s / %s us | |\n' \
       "$idle_avg" "$idle_w50" "$idle_w99"
printf '| (3) requests/s (1 connection): events / control / none | - | %s / %s / %s | |\n' \
       "$ev_rps" "$ctl_rps" "$idle_rps"
echo
echo "(1) from the start of the pipe to the first response that matched the"
echo "    sentinel stored after all $N messages (messages apply in order);"
echo "    redis-cli alone wrote $pipe_rate hashes/s."
echo "(2) time from PUBLISH to the first response with X-KV-Matched > 0 for"
echo "    a prompt nobody held; one request round trip included (the median"
echo "    probe needed $loaded_req request(s)); $evrate messages/s of other"
echo "    events were applied meanwhile."
echo "(3) wrk -c1, 8 KB chat bodies, $PAIRS x ${RUN}s per case; control = the"
echo "    same stream published on a channel nginx does not subscribe to;"
echo "    runs interleaved, then averaged; the goal is judged on the median"
echo "    (the mean and p99 follow whatever else runs on the host)."
