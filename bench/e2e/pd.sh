#!/usr/bin/env bash
#
# The pd benchmark (issue 20): the same 8 simulated GPUs (kvsim servers)
# served three ways, each on the same prompts at the same instants:
#
#   agg_kv    aggregated: 8 servers doing prefill and decode, kv_aware with
#             KV events (bench/e2e's kv_aware_events)
#   pd_kv     disaggregated: 4 prefill servers + 4 decode servers (kvsim
#             --role prefill / --role decode --sidecar), kv_aware with
#             events on both pools, kv_aware_prefill mode=header
#             min_uncached=N naming the prefill server to the decode
#             server's sidecar (llm-d's x-prefiller-host-port)
#   pd_rr     disaggregated, round-robin on both: decode upstream
#             round-robin, the prefill server drawn by split_clients on
#             $request_id; every request split
#   pd_vllm   (not in the default run) pd_kv with kv_aware_prefill
#             mode=vllm: nginx runs both legs of vLLM's NIXL contract, the
#             decode servers without --sidecar
#
# on two workloads: llm-d's shared-prefix (150 groups x 5 prompts,
# 6000 + 1200 tokens in) on a short QPS ladder, and kvload's agent
# conversations.  Then nginx's cost of a split request (bench/pd_cost.sh).
#
#   bash bench/e2e/pd.sh                 (about 5 minutes on 2 cores)
#   make bench-pd                        the same
#
#   --arms a,b          of agg_kv pd_kv pd_rr pd_vllm (default: the first 3)
#   --workloads a,b     of shared-prefix agent sessions (default: the
#                       first two; sessions: recorded Claude Code sessions,
#                       ../shared/traces/claude_code_sessions.tar.gz)
#   --no-cost           skip bench/pd_cost.sh
#   PD_MIN_UNCACHED=N   kv_aware_prefill's min_uncached (default 1024)
#   PD_SCALE=S          time compression (default 3)
#   PD_PREFILL=N        prefill servers of the 8 (default 4)
#   PD_LADDER=a,b,c     shared-prefix's QPS stages (default 5,10,15)
#   E2E_WORK, PD_RESULTS  override build/bench-pd and bench/results/pd.md
#
# Raw kvload JSON, nginx access logs (with $kv_aware_pd), status pages and
# kvsim /metrics stay in build/bench-pd/.  Method: bench/README.md, "pd".
# Everything listens on 127.0.0.1; every process is stopped on exit.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$ROOT/build
WORK=${E2E_WORK:-$BUILD/bench-pd}
RESULT=${PD_RESULTS:-$ROOT/bench/results/pd.md}
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE=${KV_AWARE_MODULE:-$BUILD/ngx_http_kv_aware_module.so}
KVSIM=$BUILD/kvsim
KVLOAD=$BUILD/kvload
PY=/usr/bin/python3

# 8 servers, llm-d's pods (4802 blocks of 64 tokens); split 4 + 4
SERVERS=8
PREFILL=${PD_PREFILL:-4}
DECODE=$(( SERVERS - PREFILL ))
BLOCKS=4802
BLOCK_TOKENS=64
# 3, not bench-e2e's 6: ITL p99 is a rare gap, and a hiccup of a loaded
# machine (kvsim's step lag) is multiplied by the scale into it
SCALE=${PD_SCALE:-3}
MIN_UNCACHED=${PD_MIN_UNCACHED:-1024}
# KV moves at 25 GB/s, 256 KiB a token (kvsim's defaults: Qwen3-32B over
# a 200 Gb/s link)
KV_BW=25
KV_TOKEN_BYTES=262144

# llm-d's shared-prefix shape: 150 groups overflow one server's cache
# (900k prefix tokens, 307k a server); 1200-token questions are always
# uncached, so above min_uncached: every request of it is split, and
# what the decode server holds decides only how much KV moves.  The top
# stage, 15 QPS: at 20 the 4 decode servers' KV (prefixes pulled and
# kept, 3.5k of their 4.8k blocks each, plus running sequences) turned
# over, they preempted and queued, and kv_aware's TTFT p90 reached 23 s
SP_ARGS="--groups 150 --prompts-per-group 5 --system-tokens 6000"
SP_ARGS+=" --question-tokens 1200 --output-tokens 150"
STAGE_S=30
SP_ARGS+=" --qps-ladder ${PD_LADDER:-5,10,15} --stage-seconds $STAGE_S"
# agents: a turn adds 100 + 800 tokens to a conversation its decode server
# may hold: under min_uncached, the decision keeps it aggregated
AG_ARGS="--groups 24 --turns 8 --system-tokens 1000 --question-tokens 2000"
AG_ARGS+=" --output-tokens 100 --tool-tokens 800 --think-ms 3000"
# the recorded Claude Code sessions (kvload --workload sessions, as
# bench-e2e's agents workload runs them, at its --quick sizes): 24
# sessions of their first 10 requests, 12 open at once, 1 a second,
# sub-agents included, each on its own clock
SESSIONS_FILE=${SESSIONS_FILE:-$ROOT/../shared/traces/claude_code_sessions.tar.gz}
SS_ARGS="--trace $SESSIONS_FILE --sessions 24 --sessions-live 12"
SS_ARGS+=" --sessions-rate 1 --session-max-tokens 96000"
SS_ARGS+=" --session-requests 10 --session-idle-max 30"
RUN_LIMIT_S=240

ARGS="$*"
ARMS="agg_kv pd_kv pd_rr"
WORKLOADS="shared-prefix agent"
COST=1
while [ $# -gt 0 ]; do
    case $1 in
    --arms) ARMS=${2//,/ }; shift ;;
    --workloads) WORKLOADS=${2//,/ }; shift ;;
    --no-cost) COST=0 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "pd.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

T0=$(date +%s)
log() { printf '[%4ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
die() { echo "pd.sh: $*" >&2; exit 1; }

launch() {
    TEST_NGINX_BINARY=$NGINX KVSIM_BINARY=$KVSIM "$ROOT/tools/kva-launch" "$@"
}

NGINX_PREFIX=
cleanup() {
    [ -n "$NGINX_PREFIX" ] && launch stop "$NGINX_PREFIX"
    local d
    for d in "$WORK/pf" "$WORK/dc" "$WORK"; do
        [ -d "$d/logs" ] && launch stop "$d"
    done
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { launch port-run "${1:-1}" || die "no free port"; }

# start_pool PREFIX BASE N CHANNEL kvsim-options...: one kvsim process
start_pool() {
    local prefix=$1 base=$2 n=$3 channel=$4; shift 4
    launch prefix "$prefix" >/dev/null
    launch start --log "$prefix/logs/kvsim.log" kvsim "$prefix" "$base" "$n" \
        --block-tokens $BLOCK_TOKENS --num-blocks $BLOCKS \
        --time-scale "$SCALE" --max-conns 4096 \
        --redis "127.0.0.1:$REDIS_PORT" --channel "$channel" --seed 1 \
        --kv-bandwidth $KV_BW --kv-token-bytes $KV_TOKEN_BYTES "$@" \
        2>/dev/null || die "kvsim did not start: $(tail -3 \
        "$prefix/logs/kvsim.log")"
}

servers() {
    local base=$1 n=$2 k
    for k in $(seq 0 $(( n - 1 ))); do
        printf '        server 127.0.0.1:%d;\n' $(( base + k ))
    done
}

# nginx.conf for one arm into $PREFIX/conf/nginx.conf
write_conf() {
    local arm=$1 prefix=$2 ups loc loc2="" k split=""
    local ev="kv_aware_events redis=127.0.0.1:$REDIS_PORT"
    case $arm in
    agg_kv)
        ups="upstream llm {
        kv_aware;
        $ev channel=kv:agg;
$(servers "$DC_BASE" $SERVERS)
        keepalive 512;
    }"
        loc="proxy_pass http://llm;" ;;
    pd_kv|pd_vllm)
        ups="upstream prefill {
        kv_aware;
        $ev channel=kv:prefill;
$(servers "$PF_BASE" $PREFILL)
    }

    upstream llm {
        kv_aware;
        $ev channel=kv:decode;
$(servers "$DC_BASE" $DECODE)
        keepalive 512;
    }"
        loc="kv_aware_prefill prefill mode=header min_uncached=$MIN_UNCACHED;
            proxy_set_header x-prefiller-host-port \$kv_aware_prefill_addr;
            proxy_pass http://llm;"
        [ "$arm" = pd_vllm ] && loc="kv_aware_prefill prefill mode=vllm
                min_uncached=$MIN_UNCACHED uri=/_kv_prefill;
            proxy_set_header X-Request-Id \$kv_aware_request_id;
            proxy_pass http://llm;"
        [ "$arm" = pd_vllm ] && loc2="# leg 1 (mode=vllm)
        location = /_kv_prefill {
            internal;
            proxy_pass http://\$kv_aware_prefill_addr\$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Request-Id \$kv_aware_request_id;
            proxy_read_timeout 600s;
            subrequest_output_buffer_size 64k;
        }" ;;
    pd_rr)
        for k in $(seq 0 $(( PREFILL - 1 ))); do
            if [ "$k" -lt $(( PREFILL - 1 )) ]; then
                split+="        $(awk "BEGIN { printf \"%.2f\", \
                    100 / $PREFILL }")% 127.0.0.1:$(( PF_BASE + k ));"$'\n'
            else
                split+="        * 127.0.0.1:$(( PF_BASE + k ));"$'\n'
            fi
        done
        ups="split_clients \$request_id \$pd_prefill {
$split    }

    upstream llm {
$(servers "$DC_BASE" $DECODE)
        keepalive 512;
    }"
        loc="proxy_set_header x-prefiller-host-port \$pd_prefill;
            proxy_pass http://llm;" ;;
    esac
    local pd_var='$kv_aware_pd' pf_var='$kv_aware_prefill_addr'
    [ "$arm" = pd_rr ] && pd_var=split pf_var='$pd_prefill'
    [ "$arm" = agg_kv ] && pd_var=- pf_var=-
    mkdir -p "$prefix/logs" "$prefix/tmp" "$prefix/conf"
    cat >"$prefix/conf/nginx.conf" <<EOF
load_module $MODULE;
$([ "$(id -u)" = 0 ] && echo "user root;")
worker_processes 1;
worker_rlimit_nofile 16384;
pid $prefix/logs/nginx.pid;
error_log $prefix/logs/error.log warn;

events {
    worker_connections 12288;
}

http {
    # the agent conversation a request belongs to (its task's first
    # bytes), so that the report knows which decode server served the
    # turn before: the one that holds all but this turn's new tokens
    map \$request_body \$pd_conv {
        '~"role":"user","content":"(?<a>\w+) (?<b>\w+) (?<c>\w+)'  \$a\$b\$c;
        default                                                   -;
    }
    log_format pd '\$request_id \$status \$uri \$upstream_addr '
                  'conv=\$pd_conv pd=$pd_var '
                  'prefill=$pf_var blocks=\$kv_aware_blocks '
                  'matched=\$kv_aware_matched reason=\$kv_aware_reason';
    access_log $prefix/logs/access.log pd;
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;
    client_body_buffer_size 1m;
    client_max_body_size 16m;
    keepalive_requests 1000000;
    keepalive_timeout 600s;

    $ups

    server {
        listen 127.0.0.1:$NGINX_PORT backlog=4096;

        location / {
            $loc
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 3600s;
            add_header X-Upstream-Addr \$upstream_addr always;
        }

        $loc2

        location = /kv_aware/status { kv_aware_status; }
    }
}
EOF
}

scrape() {
    local base=$1 n=$2 out=$3 k
    for k in $(seq 0 $(( n - 1 ))); do
        curl -s -m 5 "http://127.0.0.1:$(( base + k ))/metrics" \
            | sed "s/^/$4 /" >>"$out" || true
    done
}

# run_one WORKLOAD ARM KVLOAD-ARGS...
run_one() {
    local wl=$1 arm=$2; shift 2
    local dir=$WORK/$wl prefix=$WORK/nginx-$arm out rc=0
    out=$dir/$arm
    mkdir -p "$dir"
    rm -rf "$prefix"

    PF_BASE=$(free_port $PREFILL)
    DC_BASE=$(free_port $SERVERS)
    NGINX_PORT=$(free_port)
    write_conf "$arm" "$prefix"
    launch test "$prefix" >"$out.nginx-t.log" 2>&1 \
        || die "nginx -t failed for $arm: $(grep emerg "$out.nginx-t.log")"

    if [ "$arm" = agg_kv ]; then
        start_pool "$WORK/dc" "$DC_BASE" $SERVERS kv:agg --role both
    else
        start_pool "$WORK/pf" "$PF_BASE" $PREFILL kv:prefill --role prefill
        # mode=vllm: nginx sends leg 1, the decode server pulls alone
        start_pool "$WORK/dc" "$DC_BASE" $DECODE kv:decode --role decode \
            $([ "$arm" = pd_vllm ] || echo --sidecar)
    fi

    NGINX_PREFIX=$prefix
    launch start nginx "$prefix" >"$out.nginx.log" 2>&1 \
        || die "nginx did not start: $(tail -3 "$out.nginx.log")"

    local nd=$SERVERS kpid t0 k=1
    [ "$arm" = agg_kv ] || nd=$DECODE
    timeout -s INT -k 60 "$RUN_LIMIT_S" "$KVLOAD" \
        --target "127.0.0.1:$NGINX_PORT" --workload "$wl" \
        --time-scale "$SCALE" --seed 1 --label "$arm" \
        --metrics "127.0.0.1:$DC_BASE-$(( DC_BASE + nd - 1 ))" \
        --json "$out.json" "$@" >"$out.txt" 2>"$out.err" &
    kpid=$!
    t0=$(date +%s.%N)

    # the servers' counters at each stage's end (real time: STAGE_S /
    # SCALE), so that the report gives each stage what was computed and
    # moved while it ran (requests of a stage that end in the next count
    # there)
    while :; do
        while kill -0 "$kpid" 2>/dev/null && awk -v t0="$t0" -v k="$k" \
                -v w="$STAGE_S" -v s="$SCALE" -v now="$(date +%s.%N)" \
                'BEGIN { exit !(now < t0 + k * w / s) }'; do
            sleep 0.2
        done
        kill -0 "$kpid" 2>/dev/null || break
        : >"$out.metrics.$k"
        scrape "$DC_BASE" "$nd" "$out.metrics.$k" decode
        [ "$arm" = agg_kv ] \
            || scrape "$PF_BASE" $PREFILL "$out.metrics.$k" prefill
        k=$(( k + 1 ))
    done
    wait "$kpid" || rc=$?
    [ "$rc" = 0 ] || echo "$wl/$arm: kvload exit $rc: $(tail -2 "$out.err")" \
        | tee -a "$WORK/notes.txt"

    curl -s -m 5 "http://127.0.0.1:$NGINX_PORT/kv_aware/status" \
        >"$out.status.json" || true
    : >"$out.metrics"
    scrape "$DC_BASE" "$nd" "$out.metrics" decode
    [ "$arm" = agg_kv ] || scrape "$PF_BASE" $PREFILL "$out.metrics" prefill

    launch stop "$prefix" nginx
    NGINX_PREFIX=
    cp "$prefix/logs/access.log" "$out.access.log"
    grep -E '\[(alert|crit|emerg)\]' "$prefix/logs/error.log" \
        >"$out.alerts" || true
    launch stop "$WORK/dc" kvsim
    [ "$arm" = agg_kv ] || launch stop "$WORK/pf" kvsim
    sed -n '2,$p' "$out.txt" | sed 's/^/    /'
}

for f in "$KVSIM" "$KVLOAD" "$MODULE"; do
    [ -e "$f" ] || die "$f is missing: run 'make module tools' first"
done
command -v redis-server >/dev/null || die "redis-server is missing"

mkdir -p "$WORK" "$(dirname "$RESULT")"
rm -rf "${WORK:?}"/shared-prefix "${WORK:?}"/agent "$WORK"/nginx-* \
    "$WORK"/pf "$WORK"/dc
: >"$WORK/notes.txt"
echo "$SCALE $MIN_UNCACHED $SERVERS $PREFILL $DECODE $BLOCKS $BLOCK_TOKENS" \
    "$KV_BW $KV_TOKEN_BYTES" >"$WORK/setup.txt"

REDIS_PORT=$(free_port)
launch prefix "$WORK" >/dev/null
launch start redis "$WORK" "$REDIS_PORT" --logfile "$WORK/redis.log" \
    || die "redis-server did not start"

log "pd: $SERVERS kvsim servers (split $PREFILL prefill + $DECODE decode)," \
    "time scale $SCALE, min_uncached $MIN_UNCACHED, arms: $ARMS"
for wl in $WORKLOADS; do
    case $wl in
    shared-prefix) args=$SP_ARGS ;;
    agent) args=$AG_ARGS ;;
    sessions)
        [ -r "$SESSIONS_FILE" ] \
            || die "no sessions at $SESSIONS_FILE (SESSIONS_FILE)"
        args=$SS_ARGS ;;
    *) die "unknown workload $wl" ;;
    esac
    for arm in $ARMS; do
        log "$wl / $arm"
        # shellcheck disable=SC2086
        run_one "$wl" "$arm" $args
    done
done

if [ "$COST" = 1 ]; then
    log "nginx's cost of a split request (bench/pd_cost.sh)"
    bash "$ROOT/bench/pd_cost.sh" 3 16 >"$WORK/cost.md" 2>"$WORK/cost.err" \
        || echo "pd_cost.sh failed: $(tail -2 "$WORK/cost.err")" \
           | tee -a "$WORK/notes.txt"
fi

# the machine's load over the last 1, 5 and 15 minutes, for the report
cut -d' ' -f1-3 /proc/loadavg >"$WORK/loadavg"
"$PY" "$ROOT/bench/e2e/report_pd.py" "$WORK" "$RESULT" \
    "bash bench/e2e/pd.sh${ARGS:+ $ARGS}"
log "done in $(( $(date +%s) - T0 ))s: $RESULT"
