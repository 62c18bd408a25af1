#!/usr/bin/env bash
# Many nginx on one event channel (issue 22, section 3): 8 nginx, each its
# own prefix and one worker, all subscribed to kv_aware:events on one
# redis-server, one upstream each of 32 servers x data_parallel=8 (256
# caches), while a publisher (bench/events/fanout.pl) sends the events of
# 248 caches (servers 0-30, every rank) at a ladder of rates and a probe
# uses the last server's 8 ranks.  For each rate:
#
#   - Redis' CPU (utime + stime from /proc over the stage, share of one
#     core) and the 8 nginx workers' CPU, summed;
#   - messages applied by the 8 nginx (their status pages'
#     events.messages, from before the stream starts until they stop
#     moving after it ends) per second of the stream: what Redis
#     delivered; and the least share of the stream one nginx applied
#     (a probe's messages count too: a little over 100% when none was
#     lost);
#   - publish-to-visible in each nginx: K times the probe publishes the
#     blocks of a prompt nobody holds and sends that prompt to all 8 nginx
#     at once, again to those that did not route it to a holder yet
#     (X-KV-Matched > 0), until all did; one request round trip included,
#     as in bench/bench_events.sh (2);
#   - routing agreement: for each probe, whether the 8 nginx sent the
#     prompt to one cache, and whether that cache is the one published
#     (the servers answer with their port and the rank nginx sent them).
#
# Last, without the stream: K prompts nobody published, each sent once to
# every nginx, to show what agreement is without events (each nginx picks
# alone among 256 equal caches).
#
#   bash bench/bench_fanout.sh [--quick] [MESSAGES_PER_SECOND ...]
#       default ladder 2560 5120 10240 20480 (10 to 80 messages a second
#       a cache; 8 hashes a message); --quick: 1280 only, fewer probes.
#       FANOUT_NGINX=N changes the number of nginx (8).
#
# Bench-only settings, as in bench_events.sh: max_rate=1000000 (the
# default 20,000 messages/s a subscription would cut the top of the
# ladder), heartbeat=3600s, speculative_ttl=10ms (below the 16 ms index
# tick: only events make a prompt match), Redis' pubsub output buffer
# limit off (a lagging nginx shows as lag, not as a dropped link).
# Everything runs on 127.0.0.1 under build/bench-fanout/ and stops on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
quick=0
[ "${1:-}" = "--quick" ] && { quick=1; shift; }
rates=("$@")
[ ${#rates[@]} -gt 0 ] || if [ $quick = 1 ]; then rates=(1280)
                           else rates=(2560 5120 10240 20480); fi

NGX=${FANOUT_NGINX:-8}
SERVERS=32
DP=8
K=$(( quick ? 30 : 200 ))          # probes a stage
STAGE=$(( quick ? 5 : 15 ))        # seconds a stage at least
EVH=8                              # hashes a message

module=$root/build/ngx_http_kv_aware_module.so
prefix=$root/build/bench-fanout
launch=$root/tools/kva-launch
fan="perl $root/bench/events/fanout.pl"

[ -f "$module" ] || { echo "$module missing: make module" >&2; exit 1; }
for b in nginx redis-server redis-cli curl perl gcc; do
    command -v $b >/dev/null || { echo "$b is missing:" \
        "bash tools/install-deps.sh" >&2; exit 1; }
done
perl -MJSON::PP -e 1 2>/dev/null || { echo "perl's JSON::PP is missing" >&2
                                      exit 1; }

# one run at a time: a second would remove the first one's pid files
# and leave its processes running
mkdir -p "$root/build"
exec 9> "$prefix.lock"
flock -n 9 || { echo "another run holds $prefix.lock" >&2; exit 1; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$prefix"
mkdir -p "$prefix"
make -s --no-print-directory "$root/build/kva_hashes"
cp "$root/build/kva_hashes" "$prefix/kva_hashes"

# ports: the 32 servers in a run, then redis and the nginx
first=$("$launch" port-run $SERVERS)
read -r -a all < <("$launch" ports $(( NGX + 1 )))
rport=${all[0]}
nports=("${all[@]:1}")
for p in "${all[@]}"; do
    [ "$p" -lt "$first" ] || [ "$p" -ge $(( first + SERVERS )) ] || {
        echo "port $p in the servers' run, run again" >&2; exit 1; }
done

spid=
cleanup() {
    set +e
    [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
    for i in $(seq 0 $(( NGX - 1 ))); do
        "$launch" stop "$prefix/nginx-$i" 2>/dev/null
    done
    "$launch" stop "$prefix/backends" 2>/dev/null
    "$launch" stop "$prefix/redis" 2>/dev/null
}
trap cleanup EXIT INT TERM

"$launch" prefix "$prefix/redis" >/dev/null
"$launch" start redis "$prefix/redis" "$rport" \
    --client-output-buffer-limit pubsub 0 0 0 >/dev/null
rpid=$("$launch" pid "$prefix/redis" redis)
grep -q redis "/proc/$rpid/comm" || { echo "no redis at pid $rpid" >&2
                                       exit 1; }
rcli() { redis-cli -p "$rport" "$@"; }

# the servers: one nginx of 32 ports, each answering with its port and
# the rank the balancer sent ("PORT/RANK")
listens=$(for s in $(seq 0 $(( SERVERS - 1 ))); do
              echo "listen 127.0.0.1:$(( first + s ));"; done)
"$launch" prefix "$prefix/backends" >/dev/null
"$launch" conf "$prefix/backends" --log-level warn --connections 4096 \
    <<EOF >/dev/null
    server {
        $listens
        keepalive_requests 1000000;
        location / { return 200 "\$server_port/\$http_x_data_parallel_rank"; }
    }
EOF
"$launch" start nginx "$prefix/backends"

servers=$(for s in $(seq 0 $(( SERVERS - 1 ))); do
              echo "server 127.0.0.1:$(( first + s ));"; done)
for i in $(seq 0 $(( NGX - 1 ))); do
    p=$prefix/nginx-$i
    "$launch" prefix "$p" >/dev/null
    KV_AWARE_MODULE=$module "$launch" conf "$p" --log-level notice \
        --connections 4096 <<EOF >/dev/null
    client_body_buffer_size 64k;

    upstream llm {
        kv_aware data_parallel=$DP;
        kv_aware_events redis=127.0.0.1:$rport heartbeat=3600s
                        speculative_ttl=10ms max_rate=1000000;
        $servers
        keepalive 64;
    }

    server {
        listen 127.0.0.1:${nports[$i]};
        keepalive_requests 1000000;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location / {
            proxy_pass http://llm;
            proxy_set_header X-data-parallel-rank \$kv_aware_dp_rank;
            add_header X-KV-Matched \$kv_aware_matched;
        }
        location = /kv_status { kv_aware_status; }
    }
EOF
    "$launch" start nginx "$p"
done

for _ in $(seq 100); do
    [ "$(rcli pubsub numsub kv_aware:events | tail -1)" = "$NGX" ] && break
    sleep 0.1
done
[ "$(rcli pubsub numsub kv_aware:events | tail -1)" = "$NGX" ] || {
    echo "not every nginx subscribed:" >&2
    tail -n 5 "$prefix"/nginx-*/logs/error.log >&2; exit 1; }

hz=$(getconf CLK_TCK)
ticks() { awk '{ s += $14 + $15 } END { print s + 0 }' "$@"; }
workers=()
for i in $(seq 0 $(( NGX - 1 ))); do
    m=$("$launch" pid "$prefix/nginx-$i" nginx)
    workers+=($(pgrep -P "$m"))
done
wstat=("${workers[@]/#//proc/}"); wstat=("${wstat[@]/%//stat}")
now() { date +%s.%N; }
# Redis links the nginx lost (a subscriber that read nothing for its
# timeout reconnects, and what was published meanwhile is lost to it)
lost() { cat "$prefix"/nginx-*/logs/error.log | grep -c 'subscriber lost' ||
         true; }
# messages applied by each nginx, one a line
applied() {
    for p in "${nports[@]}"; do
        curl -s "http://127.0.0.1:$p/kv_status" | perl -MJSON::PP -e '
            my $e = decode_json(join "", <STDIN>)->{upstreams}{llm}{events};
            my $r = 0; $r += $_ for values %{ $e->{rejected} };
            print "$e->{messages} $r\n"'
    done
}
max() { perl -e 'print $ARGV[0] > $ARGV[1] ? $ARGV[0] : $ARGV[1]' "$@"; }
pct() {    # pct P < numbers  (nearest rank)
    sort -g | awk -v p="$1" '{ a[NR] = $1 } END {
        i = int(NR * p / 100 + 0.999999); if (i < 1) i = 1; print a[i] }'; }
nlist=$(IFS=,; echo "${nports[*]}")
probe_server=127.0.0.1:$(( first + SERVERS - 1 ))

{
echo "$NGX nginx (1 worker each) on one redis-server, $SERVERS servers x" \
     "data_parallel=$DP = $(( SERVERS * DP )) caches an upstream;" \
     "$(( (SERVERS - 1) * DP )) caches stream, $EVH hashes a message," \
     "$K probes a stage; $(nproc) cores, load average $load0 at the start"
echo
echo "| offered msg/s | sent | delivered msg/s, least share of the sent one nginx applied | Redis CPU | nginx workers' CPU (sum) | links lost | publish-to-visible p50 / p99 (worst nginx) | p99 all | probes agreeing / on the published cache |"
echo "|---:|---:|---|---:|---:|---:|---|---:|---|"
} | tee "$prefix/result.md"

for rate in "${rates[@]}"; do
    s0=$(applied)
    $fan stream --redis "$rport" --first "$first" \
        --servers $(( SERVERS - 1 )) --ranks $DP --rate "$rate" \
        --hashes $EVH --seconds $(( STAGE + 120 )) \
        --seq-file "$prefix/stream.seq" > "$prefix/stream-$rate.out" 2>&1 &
    spid=$!
    sleep 2
    kill -0 "$spid" 2>/dev/null || { cat "$prefix/stream-$rate.out" >&2
                                     exit 1; }
    l0=$(lost); r0=$(ticks "/proc/$rpid/stat")
    w0=$(ticks "${wstat[@]}"); t0=$(now)
    $fan probe --redis "$rport" --nginx "$nlist" --server "$probe_server" \
        --ranks $DP --hasher "$prefix/kva_hashes" --count $K \
        --tag "r$rate" --seq-file "$prefix/probe.seq" \
        > "$prefix/probe-$rate.out" 2> "$prefix/probe-$rate.err" || true
    while perl -e 'exit(($ARGV[1] - $ARGV[0]) < $ARGV[2] ? 0 : 1)' \
          "$t0" "$(now)" "$STAGE"; do sleep 0.5; done
    l1=$(lost); r1=$(ticks "/proc/$rpid/stat")
    w1=$(ticks "${wstat[@]}"); t1=$(now)
    kill "$spid"; wait "$spid" 2>/dev/null || true; spid=
    read -r n secs < "$prefix/stream-$rate.out"
    sent=$(echo "$n / $secs" | bc -l)
    # what each nginx applied of the whole stream, once it caught up
    s1=$(applied)
    for _ in $(seq 30); do
        sleep 1; s2=$(applied)
        [ "$s2" = "$s1" ] && break
        s1=$s2
    done

    f=$prefix/probe-$rate.out
    dt=$(perl -e 'print $ARGV[1] - $ARGV[0]' "$t0" "$t1")
    del=$(paste -d' ' <(echo "$s0") <(echo "$s1") | awk -v d="$secs" \
              -v n="$n" '
        { m = $3 - $1; s += m; if (NR == 1 || m < lo) lo = m
          rej += $4 - $2 }
        END { printf "%.0f, %.1f%%%s", s / d, 100 * lo / n,
              rej ? sprintf(", %d rejected", rej) : "" }')
    lat="probe failed: $(sed -n 1p "$prefix/probe-$rate.err") | |"
    agree="-"
    if [ -s "$f" ]; then
        worst50=0; worst99=0
        for c in $(seq 1 "$NGX"); do
            p50=$(awk -v c=$c '{ print $c * 1000 }' "$f" | pct 50)
            p99=$(awk -v c=$c '{ print $c * 1000 }' "$f" | pct 99)
            echo "$rate nginx-$(( c - 1 )) p50 $p50 ms p99 $p99 ms" \
                >> "$prefix/per-nginx.txt"
            worst50=$(max "$p50" "$worst50")
            worst99=$(max "$p99" "$worst99")
        done
        all99=$(awk -v n="$NGX" '
                    { for (c = 1; c <= n; c++) print $c * 1000 }' "$f" | pct 99)
        lat=$(printf '%.2f / %.2f ms | %.2f ms' "$worst50" "$worst99" "$all99")
        agree=$(awk -v n="$NGX" '{ a += $(n + 1); r += $(n + 2) }
                         END { printf "%d / %d of %d", a, r, NR }' "$f")
        [ -s "$prefix/probe-$rate.err" ] &&
            agree="$agree (then: $(sed -n 1p "$prefix/probe-$rate.err"))"
    fi
    printf '| %d | %.0f | %s | %.1f%% | %.1f%% | %d | %s | %s |\n' \
        "$rate" "$sent" "$del" \
        "$(echo "($r1 - $r0) / $hz / $dt * 100" | bc -l)" \
        "$(echo "($w1 - $w0) / $hz / $dt * 100" | bc -l)" $(( l1 - l0 )) \
        "$lat" "$agree" | tee -a "$prefix/result.md"
done

spread=$($fan spread --nginx "$nlist" --count $K --tag spread)
{
echo
echo "Without events ($K prompts nobody published, each sent once to every"
echo "nginx): ${spread% *} of ${spread#* } routed to one cache by all $NGX."
echo
echo "Per nginx (publish-to-visible):"
sed 's/^/    /' "$prefix/per-nginx.txt"
echo
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
} | tee -a "$prefix/result.md"

if grep -E '\[(alert|crit|emerg)\]|exited on signal' \
        "$prefix"/nginx-*/logs/error.log >&2; then
    echo "nginx logged errors" >&2; exit 1
fi
