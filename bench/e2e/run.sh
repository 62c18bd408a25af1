#!/usr/bin/env bash
#
# End-to-end benchmark: nginx balancing policies in front of kvsim (8
# simulated vLLM-like servers), driven by kvload on llm-d's QPS ladder.
#
#   bash bench/e2e/run.sh             full run (about 35 minutes, 2 cores)
#   bash bench/e2e/run.sh --quick     smoke run (about 5 minutes)
#   bash bench/e2e/run.sh --workloads trace     the trace alone (9 min)
#   bash bench/e2e/run.sh --workloads agent     agent conversations (2 min)
#   bash bench/e2e/run.sh --workloads agents    recorded Claude Code sessions
#                                               (about 26 min; --agents-long)
#   bash bench/e2e/run.sh --workloads llm-d     llm-d's run, its hardware
#                                               (11 min)
#
#   --policies a,b     subset of: round_robin least_conn random_two
#                      hash_prefix kv_aware kv_aware_events kv_aware_bridge
#                      kv_aware_ttft (cost=ttft, learned; not in the default
#                      set)
#   --slow-servers I,J kvsim servers (0-based) that prefill slower, by
#   --slow-factor F    F (default 2): a heterogeneous pool
#   --scale S          time compression (default: see below)
#   --stage-seconds T, --stage-requests N   stage bounds (uncompressed)
#   --workloads a,b    subset of: shared-prefix multi-turn no-sharing trace
#                      agent llm-d agents (agents: not in the default set);
#                      the report also takes what earlier runs left for others
#   --no-extra         shared-prefix only
#   --agents-long      agents: more and longer sessions (about 40 min)
#   E2E_WORK, E2E_RESULTS  override build/bench-e2e and bench/results
#                      (partial and --quick runs write to build/bench-e2e/results)
#
# Writes bench/results/e2e-summary.md, e2e-<policy>.md, e2e-all.csv and
# e2e-ttft-p90.png, for the trace e2e-trace.md and e2e-trace.csv, for
# llm-d's run e2e-llm-d.md (a run of the trace or of llm-d alone, every
# policy, publishes those only); raw
# kvload JSON/CSV and logs stay in build/bench-e2e/.
# Method and caveats: bench/README.md.  Everything listens on 127.0.0.1;
# every wait is bounded; every process started here is stopped on exit.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$ROOT/build
WORK=${E2E_WORK:-$BUILD/bench-e2e}
RESULTS=${E2E_RESULTS:-$ROOT/bench/results}
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE=${KV_AWARE_MODULE:-$BUILD/ngx_http_kv_aware_module.so}
KVSIM=$BUILD/kvsim
KVLOAD=$BUILD/kvload
KVBRIDGE=$BUILD/kvbridge
PY=/usr/bin/python3

ALL_POLICIES="round_robin least_conn random_two hash_prefix kv_aware"
ALL_POLICIES+=" kv_aware_events kv_aware_bridge"
# asked for by name (--policies), as are slow servers (--slow-servers)
SLOW_SERVERS=${SLOW_SERVERS:-}
SLOW_FACTOR=${SLOW_FACTOR:-2}

# The model servers: llm-d's benchmark pods (8 x 4802 blocks of 64 tokens).
SERVERS=8
BLOCKS=4802
BLOCK_TOKENS=64
# what kvload's requests say in "model": the token keys' seed
MODEL=kvsim
# kv_aware_bridge: prompts as token ids (kvload --prompt-ids 1: the event
# path alone, no tokenizer), or chat that nginx tokenizes (BRIDGE_PROMPTS=
# chat); how long a request waits for its token ids then
BRIDGE_PROMPTS=${BRIDGE_PROMPTS:-ids}
TOKENIZE_TIMEOUT=${TOKENIZE_TIMEOUT:-200ms}

# ---------------------------------------------------------------------------
# KV events: `kv_aware_events redis=... channel=...` in the upstream, after
# `kv_aware` (docs/reference.md, "kv_aware_events").  The line is checked with
# `nginx -t` first; a module built without it makes the kv_aware_events
# policy skip with a message instead of failing the run.  Override:
#   KV_EVENTS_CONF='kv_aware_events redis=@REDIS@ channel=@CHANNEL@;'
#   KV_EVENTS_CONTEXT=upstream|http   (where the line goes)
# @REDIS@ becomes 127.0.0.1:PORT, @CHANNEL@ the kvsim channel.
# ---------------------------------------------------------------------------
EVENTS_DEFAULT='kv_aware_events redis=@REDIS@ channel=@CHANNEL@;'
KV_EVENTS_CONF=${KV_EVENTS_CONF:-$EVENTS_DEFAULT}
KV_EVENTS_CONTEXT=${KV_EVENTS_CONTEXT:-upstream}
CHANNEL=kv_aware:events

# ---------------------------------------------------------------------------
# Workload and compression.  llm-d: 150 groups x 5 prompts, 6000 + 1200
# tokens in, 1000 out, Poisson 3 -> 60 QPS.  Here: the same shape, stages
# of 20 uncompressed seconds each (2,660 requests, 2.7M streamed tokens per
# policy; llm-d's stages are longer), back to back, at time scale 6: 37-55 s
# per policy, 6 minutes for everything on 2 cores, nginx + kvsim + kvload
# using about one core together (measured; bench/README.md).  Every policy gets
# the same seed, so the same prompts at the same instants.
# ---------------------------------------------------------------------------
SCALE=6
LADDER=3,10,20,40,60
STAGE_REQUESTS=0
STAGE_SECONDS=20
SP_GROUPS=150
PROMPTS=5
SYSTEM_TOKENS=6000
QUESTION_TOKENS=1200
OUTPUT_TOKENS=1000
# shorter runs of the other two workloads
MT_ARGS="--groups 200 --turns 4 --system-tokens 2000 --question-tokens 400"
MT_ARGS+=" --output-tokens 300 --qps-ladder 5,20,40 --stage-seconds 10"
NS_ARGS="--system-tokens 6000 --question-tokens 1200 --output-tokens 300"
NS_ARGS+=" --qps-ladder 5,20 --stage-seconds 10"
NS_POLICIES="round_robin least_conn kv_aware kv_aware_events kv_aware_ttft"
# agents: conversations that each grow a private history past 20k tokens
# on a shared 1k-token system prompt, one turn at a time (kvload_agent.c);
# 64 of them overflow one server's KV cache 3 times over, not eight's
AG_ARGS="--groups 64 --turns 20 --system-tokens 1000 --question-tokens 2000"
AG_ARGS+=" --output-tokens 100 --tool-tokens 800 --think-ms 3000"
AG_ARGS+=" --servers $SERVERS"
AG_POLICIES="round_robin least_conn kv_aware kv_aware_events kv_aware_ttft"

# ---------------------------------------------------------------------------
# The trace workload: Mooncake's conversation trace (../shared/traces/,
# 512-token block ids), a window of TRACE_SECONDS from TRACE_START replayed
# at its recorded times (kvload --workload trace), TRACE_SCALE faster, on
# TRACE_SERVERS servers of the same pools.  4 servers: the window asks
# about 39k uncached prefill tokens/s of 62k they can do (62%), so
# round-robin queues behind long prompts while least_conn mostly does not;
# scale 10: about 80 s a policy, kvsim's steps within a few ms of its clock
# (the step lag, reported).  The bounds (trace_bounds.py) are computed for
# the same window and the servers' pools together.
# ---------------------------------------------------------------------------
TRACE_FILE=${TRACE_FILE:-$ROOT/../shared/traces/mooncake_conversation_trace.jsonl}
TRACE_SERVERS=${TRACE_SERVERS:-4}
TRACE_SCALE=${TRACE_SCALE:-10}
TRACE_START=${TRACE_START:-600}
TRACE_SECONDS=${TRACE_SECONDS:-600}
# kv_aware's parameters for the trace (KV_AWARE_PARAMS comes after them):
# what nginx learns of a server bounded by its pool, as an operator would
# say it (kvsim's events say it too: kv_tokens); TRACE_KV_PARAMS=" " for
# the TTL alone
TRACE_KV_PARAMS=${TRACE_KV_PARAMS:-learned_tokens=$(( BLOCKS * BLOCK_TOKENS ))}

# ---------------------------------------------------------------------------
# llm-d's regime: its published run (llm-d-kv-cache-manager,
# benchmarking/73-capacity: 8 pods of Qwen3-32B on 2 H100 each, 307,328
# KV tokens a pod, 150 groups x 5 prompts of 6,000 + 1,200 tokens sent
# cyclically) with its warm-up and its ladder of 16 Poisson stages, each
# of its own length, on kvsim calibrated to the ITL those pods measured
# (--calibration llm-d; kvsim_sched.c).  Its config asks for 1,000 tokens
# out, yet it published 10,300-10,500 output tokens/s for 52-60 requests/s
# at the top (177-196 a request), and no 8 pods decode 60,000 tokens/s of
# 7,300-token contexts; 180 is what its pods generated a request there.
# ---------------------------------------------------------------------------
LLMD_WARMUP=15:50
LLMD_LADDER="3:20,10:20,15:20,20:38,22:34,25:30,30:25,35:21,40:38,43:36"
LLMD_LADDER+=",46:33,49:30,52:29,55:27,57:26,60:25"
LLMD_OUTPUT_TOKENS=${LLMD_OUTPUT_TOKENS:-180}
# time scale 4: at 6 kvsim's steps ran up to 200 ms (real) behind its
# clock at the top stages on 2 cores, which showed as TTFT; at 4, 38 ms
LLMD_SCALE=${LLMD_SCALE:-4}
LLMD_POLICIES="round_robin least_conn kv_aware kv_aware_events kv_aware_ttft"
LLMD_ARGS="--groups 150 --prompts-per-group 5 --system-tokens 6000"
LLMD_ARGS+=" --question-tokens 1200 --output-tokens $LLMD_OUTPUT_TOKENS"
LLMD_ARGS+=" --max-inflight 5000"
# round-robin's queue outlasts the ladder by minutes of simulated time
LLMD_RUN_LIMIT_S=420
BUDGET_S=1800
RUN_LIMIT_S=240

# ---------------------------------------------------------------------------
# The agents workload: recorded Claude Code sessions (../shared/traces/,
# claude_code_sessions.tar.gz; kvload --workload sessions), each replayed
# on its own clock, sub-agents included, on 8 servers of AGENTS_BLOCKS
# blocks.  A default run: the first AGENTS_SESSIONS sessions of the
# archive whose prompts stay under AGENTS_MAX_TOKENS (so that one fits a
# server's pool), each cut to its first AGENTS_REQUESTS requests, pauses
# over AGENTS_IDLE_MAX s shortened; they arrive at AGENTS_RATE a second,
# at most AGENTS_LIVE open at once.  Sized so that the contexts of the
# live sessions are about 3x the servers' pools together: kvload measured
# 48.3 sessions open and 2.53M tokens of context on time average, on 8 x
# 1,600 blocks of 64 tokens (819k): 3.1x.  About 190 s a policy.  Two variants: sessions apart (each shares
# nothing) and shared (every session's first system + tool tokens the same
# text, an assumption: agents of one product send the same system prompt
# and tools).  The bounds (session_bounds.py) come from each run's own
# requests, in the order it sent them.  AGENTS_SKIP skips the first
# sessions selected (held-out sets).
# ---------------------------------------------------------------------------
SESSIONS_FILE=${SESSIONS_FILE:-$ROOT/../shared/traces/claude_code_sessions.tar.gz}
# sized by hand (any AGENTS_* below set): the results are not published
AGENTS_CUSTOM=$(env | grep -c -E '^AGENTS_(SESSIONS|LIVE|RATE|REQUESTS|'\
'IDLE_MAX|BLOCKS|MAX_TOKENS|SCALE|SKIP|VARIANTS)=' || true)
AGENTS_LONG=${AGENTS_LONG:-0}
AGENTS_POLICIES="round_robin least_conn kv_aware kv_aware_events kv_aware_ttft"
AGENTS_VARIANTS=${AGENTS_VARIANTS:-apart shared}
AGENTS_SKIP=${AGENTS_SKIP:-0}

QUICK=0
ALL_WORKLOADS="shared-prefix multi-turn no-sharing trace agent llm-d"
WORKLOADS=$ALL_WORKLOADS
POLICIES=$ALL_POLICIES

while [ $# -gt 0 ]; do
    case $1 in
    --quick) QUICK=1 ;;
    --policies) POLICIES=${2//,/ }; shift ;;
    --scale) SCALE_OPT=$2; shift ;;
    --stage-seconds) STAGE_SECONDS_OPT=$2; shift ;;
    --stage-requests) STAGE_REQUESTS_OPT=$2; shift ;;
    --no-extra) WORKLOADS=shared-prefix ;;
    --workloads) WORKLOADS=${2//,/ }; shift ;;
    --agents-long) AGENTS_LONG=1 ;;
    --slow-servers) SLOW_SERVERS=$2; shift ;;
    --slow-factor) SLOW_FACTOR=$2; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

# only the full, default run replaces the published results
if [ -z "${E2E_RESULTS:-}" ] && { [ "$QUICK" = 1 ] \
        || [ "$POLICIES" != "$ALL_POLICIES" ] \
        || { [ "$WORKLOADS" != "$ALL_WORKLOADS" ] \
             && [ "$WORKLOADS" != trace ] && [ "$WORKLOADS" != llm-d ] \
             && { [ "$WORKLOADS" != agents ] \
                  || [ "$AGENTS_CUSTOM" != 0 ]; }; } \
        || [ -n "${KV_AWARE_PARAMS:-}" ] || [ -n "$SLOW_SERVERS" ]; }; then
    RESULTS=$WORK/results
fi

if [ "$QUICK" = 1 ]; then
    SCALE=10
    SP_GROUPS=50
    STAGE_SECONDS=10
    OUTPUT_TOKENS=300
    MT_ARGS="--groups 60 --turns 3 --system-tokens 2000 --question-tokens 400"
    MT_ARGS+=" --output-tokens 100 --qps-ladder 10,40 --stage-seconds 5"
    NS_ARGS="--system-tokens 6000 --question-tokens 1200 --output-tokens 100"
    NS_ARGS+=" --qps-ladder 10,40 --stage-seconds 5"
    AG_ARGS="--groups 24 --turns 8 --system-tokens 1000 --question-tokens 2000"
    AG_ARGS+=" --output-tokens 50 --tool-tokens 800 --think-ms 3000"
    AG_ARGS+=" --servers $SERVERS"
    TRACE_SECONDS=120
    TRACE_SCALE=20
    # llm-d's shape on a short ladder
    LLMD_WARMUP=15:20
    LLMD_LADDER=3:20,30:20,60:20
    # agents: 24 sessions of 10 requests, 12 live (well under 3x the pools)
    : "${AGENTS_SESSIONS:=24}" "${AGENTS_LIVE:=12}" "${AGENTS_RATE:=1}"
    : "${AGENTS_REQUESTS:=10}" "${AGENTS_SCALE:=20}"
    : "${AGENTS_BUDGET_S:=480}"
    BUDGET_S=300
    RUN_LIMIT_S=60
fi

if [ "$AGENTS_LONG" = 1 ]; then
    # 2,400-block pools (154k tokens), sessions up to 144k tokens and 60
    # requests, 72 live (about 72k tokens each: near 3x, not measured),
    # 200 of them
    : "${AGENTS_SESSIONS:=200}" "${AGENTS_LIVE:=72}" "${AGENTS_RATE:=2}"
    : "${AGENTS_REQUESTS:=60}" "${AGENTS_IDLE_MAX:=60}"
    : "${AGENTS_BLOCKS:=2400}" "${AGENTS_MAX_TOKENS:=144000}"
    : "${AGENTS_SCALE:=15}" "${AGENTS_RUN_LIMIT_S:=600}"
    : "${AGENTS_BUDGET_S:=4800}"
fi
AGENTS_SESSIONS=${AGENTS_SESSIONS:-96}
AGENTS_LIVE=${AGENTS_LIVE:-64}
AGENTS_RATE=${AGENTS_RATE:-2}
AGENTS_REQUESTS=${AGENTS_REQUESTS:-30}
AGENTS_IDLE_MAX=${AGENTS_IDLE_MAX:-30}
AGENTS_BLOCKS=${AGENTS_BLOCKS:-1600}
AGENTS_MAX_TOKENS=${AGENTS_MAX_TOKENS:-96000}
AGENTS_SCALE=${AGENTS_SCALE:-15}
AGENTS_RUN_LIMIT_S=${AGENTS_RUN_LIMIT_S:-300}
# the agents' own share of the time budget, beside the others'
case " $WORKLOADS " in
*" agents "*) BUDGET_S=$(( BUDGET_S + ${AGENTS_BUDGET_S:-2400} )) ;;
esac

SCALE=${SCALE_OPT:-$SCALE}
STAGE_SECONDS=${STAGE_SECONDS_OPT:-$STAGE_SECONDS}
STAGE_REQUESTS=${STAGE_REQUESTS_OPT:-$STAGE_REQUESTS}

T0=$(date +%s)

# kvsim's arguments for a heterogeneous pool, none without one
SLOW_ARGS=()
if [ -n "$SLOW_SERVERS" ]; then
    SLOW_ARGS=(--slow-servers "$SLOW_SERVERS" --slow-factor "$SLOW_FACTOR")
fi

log() { printf '[%4ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
die() { echo "run.sh: $*" >&2; exit 1; }

# nginx, redis-server and kvsim start and stop as in the tests
# (tools/kva-launch, t/lib/KvAware/Launch.pm): ready when nginx's workers
# run, redis answers PING, kvsim's ports accept; SIGTERM, SIGKILL after 5 s
launch() {
    TEST_NGINX_BINARY=$NGINX KVSIM_BINARY=$KVSIM "$ROOT/tools/kva-launch" "$@"
}

NGINX_PREFIX=
cleanup() {
    [ -n "$NGINX_PREFIX" ] && launch stop "$NGINX_PREFIX"
    [ -d "$WORK/logs" ] && launch stop "$WORK"
    [ -d "$WORK/tokenizer/logs" ] && launch stop "$WORK/tokenizer"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a free port, or the first of $1 consecutive free ports
free_port() {
    launch port-run "${1:-1}" || die "no free port"
}

# utime + stime, in clock ticks, of the given pids and their children
cpu_ticks() {
    local t=0 p f
    for p in "$@" $(for p in "$@"; do pgrep -P "$p" || true; done); do
        f=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null) || continue
        set -- $f
        t=$(( t + ${12} + ${13} ))
    done
    echo $t
}

start_kvsim() {
    launch start --log "$1" kvsim "$WORK" "$KV_BASE" $SERVERS \
        --block-tokens $BLOCK_TOKENS --num-blocks $BLOCKS \
        --time-scale "$SCALE" --calibration "$CALIBRATION" --max-conns 4096 \
        --redis "127.0.0.1:$REDIS_PORT" --channel "$CHANNEL" --seed 1 \
        "${SLOW_ARGS[@]}" \
        2>/dev/null || die "kvsim did not start: $(tail -3 "$1")"
    KVSIM_PID=$(launch pid "$WORK" kvsim)
}

# kvsim publishing vLLM's wire format (ZeroMQ, msgpack, token keys) and
# kvbridge following its servers: the kv_aware_bridge policy
start_engines() {
    local out=$1 zmq k engines=()
    zmq=$(free_port $(( 2 * SERVERS )))
    launch start --log "$out.kvsim.log" kvsim "$WORK" "$KV_BASE" $SERVERS \
        --block-tokens $BLOCK_TOKENS --num-blocks $BLOCKS \
        --time-scale "$SCALE" --calibration "$CALIBRATION" --max-conns 4096 \
        --redis off --keyspace tokens --events zmq --zmq-port "$zmq" --seed 1 \
        "${SLOW_ARGS[@]}" 2>/dev/null || die "kvsim did not start: $(tail -3 "$out.kvsim.log")"
    KVSIM_PID=$(launch pid "$WORK" kvsim)
    for k in $(seq 0 $(( SERVERS - 1 ))); do
        engines+=(--engine "127.0.0.1:$(( KV_BASE + k )) model=$MODEL"\
" events=tcp://127.0.0.1:$(( zmq + 2 * k ))"\
" replay=tcp://127.0.0.1:$(( zmq + 2 * k + 1 ))"\
" metrics=http://127.0.0.1:$(( KV_BASE + k ))/metrics")
    done
    launch start --log "$out.kvbridge.log" kvbridge "$WORK" \
        --redis "127.0.0.1:$REDIS_PORT" --channel "$CHANNEL" \
        "${engines[@]}" \
        || die "kvbridge did not start: $(tail -3 "$out.kvbridge.log")"
    launch prefix "$WORK/tokenizer" >/dev/null
    launch start --log "$out.tokenizer.log" kvsim "$WORK/tokenizer" \
        "$TOK_PORT" 1 --block-tokens $BLOCK_TOKENS --keyspace tokens \
        --redis off --max-conns 4096 \
        || die "the tokenizer did not start: $(tail -3 "$out.tokenizer.log")"
}

# nginx.conf for one policy into $1
write_conf() {
    local conf=$1 policy=$2 prefix=$3 line="" mod="" http_extra="" ups_extra=""
    local k servers="" user="" status="" loc_extra=""
    local tok_location=""
    case $policy in
    round_robin) line="" ;;
    least_conn) line="least_conn;" ;;
    random_two) line="random two least_conn;" ;;
    hash_prefix) line='hash $kv_prefix_key consistent;' ;;
    kv_aware) line="kv_aware $WL_KV_PARAMS ${KV_AWARE_PARAMS:-};" ;;
    kv_aware_ttft)
        line="kv_aware $WL_KV_PARAMS cost=ttft ${KV_AWARE_PARAMS:-};" ;;
    kv_aware_events)
        line="kv_aware $WL_KV_PARAMS ${KV_AWARE_PARAMS:-};"
        local ev=${KV_EVENTS_CONF//@REDIS@/127.0.0.1:$REDIS_PORT}
        ev=${ev//@CHANNEL@/$CHANNEL}
        if [ "$KV_EVENTS_CONTEXT" = http ]; then
            http_extra=$ev
        else
            ups_extra=$ev
        fi ;;
    kv_aware_bridge)
        # the engines' own events (vLLM's wire format) through kvbridge,
        # in the token key space; nginx tokenizes with /tokenize of a
        # kvsim of its own, as vLLM serves /tokenize from its API server,
        # not from the engine's step loop (docs/engines.md)
        line="kv_aware keys=tokens block_tokens=$BLOCK_TOKENS $WL_KV_PARAMS"
        line+=" ${KV_AWARE_PARAMS:-};"
        ups_extra="kv_aware_events redis=127.0.0.1:$REDIS_PORT channel=$CHANNEL;"
        loc_extra="kv_aware_tokenize /_tokenize timeout=$TOKENIZE_TIMEOUT;"
        http_extra="upstream tokenizers {
        server 127.0.0.1:$TOK_PORT;
        keepalive 64;
    }"
        tok_location="location = /_tokenize {
            internal;
            proxy_pass http://tokenizers/tokenize;
            subrequest_output_buffer_size 1m;
            proxy_buffer_size 64k;
            proxy_buffers 16 64k;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }" ;;
    *) die "unknown policy $policy" ;;
    esac
    case $policy in
    kv_aware*)
        mod="load_module $MODULE;"
        status="location = /kv_aware/status { kv_aware_status; }" ;;
    esac
    [ "$(id -u)" = 0 ] && user="user root;"
    # BENCH_ACCESS_LOG=1: each request's server, reason, matched blocks
    # and times, to see why a session left its server; costs a write a
    # request, so not in published runs
    local access="access_log off;"
    case $policy in
    kv_aware*)
        [ "${BENCH_ACCESS_LOG:-0}" = 1 ] && access="log_format kva '\$msec \$http_x_session_affinity \$upstream_addr \$kv_aware_reason \$kv_aware_matched/\$kv_aware_blocks \$upstream_http_x_kvsim_cached_tokens \$upstream_response_time \$request_time \$upstream_header_time';
    access_log $prefix/logs/access.log kva;" ;;
    esac
    for k in $(seq 0 $(( SERVERS - 1 ))); do
        servers+="        server 127.0.0.1:$(( KV_BASE + k ));"$'\n'
    done
    mkdir -p "$prefix/logs" "$prefix/tmp" "$prefix/conf"
    cat >"$conf" <<EOF
$mod
$user
worker_processes 1;
worker_rlimit_nofile 16384;
pid $prefix/logs/nginx.pid;
error_log $prefix/logs/error.log warn;
pcre_jit on;

events {
    worker_connections 12288;
}

http {
    $access
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;

    # bodies stay in memory: kv_aware and \$request_body both need that
    client_body_buffer_size 1m;
    client_max_body_size 16m;
    keepalive_requests 1000000;
    keepalive_timeout 600s;

    # A prompt-prefix key for stock nginx: the first 1024 bytes of the first
    # message's content (the system prompt here; 256 pseudo-tokens), cut
    # from the buffered body by a regex.  Bodies without it hash to "".
    map \$request_body \$kv_prefix_key {
        '~"content"\s*:\s*"(?<kvpfx>[^"]{1,1024})'  \$kvpfx;
        default                                     "";
    }

    $http_extra

    upstream llm {
        $line
$servers
        $ups_extra
        keepalive 512;
        keepalive_requests 1000000;
        keepalive_timeout 600s;
    }

    server {
        listen 127.0.0.1:$NGINX_PORT backlog=4096;

        location / {
            proxy_pass http://llm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            add_header X-Upstream-Addr \$upstream_addr always;
            $loc_extra
        }

        $tok_location

        $status
    }
}
EOF
}

# run_one WORKLOAD POLICY KVLOAD-ARGS...: fresh kvsim and nginx, one kvload
run_one() {
    local wl=$1 policy=$2; shift 2
    local dir=$WORK/$wl prefix=$WORK/nginx-$policy
    local out=$dir/$policy err
    mkdir -p "$dir"

    if [ $(( $(date +%s) - T0 )) -ge "$BUDGET_S" ]; then
        echo "$wl/$policy: not run, the ${BUDGET_S}s budget is spent" \
            | tee -a "$WORK/skipped.txt"
        return 0
    fi

    case $policy in
    kv_aware*)
        if [ ! -f "$MODULE" ]; then
            echo "$wl/$policy: skipped, $MODULE is missing (make module)" \
                | tee -a "$WORK/skipped.txt"
            return 0
        fi ;;
    esac

    KV_BASE=$(free_port $SERVERS)
    NGINX_PORT=$(free_port)
    while [ "$NGINX_PORT" -ge "$KV_BASE" ] \
          && [ "$NGINX_PORT" -lt $(( KV_BASE + SERVERS )) ]; do
        NGINX_PORT=$(free_port)
    done

    TOK_PORT=$(free_port)
    write_conf "$prefix/conf/nginx.conf" "$policy" "$prefix"

    if ! err=$(launch test "$prefix" 2>&1); then
        if [ "$policy" = kv_aware_events ] || [ "$policy" = kv_aware_bridge ]
        then
            echo "$wl/$policy: skipped, nginx rejects its directives" \
                 "(KV_EVENTS_CONF in run.sh): $(echo "$err" | grep emerg \
                 | head -1)" | tee -a "$WORK/skipped.txt"
            return 0
        fi
        die "nginx -t failed for $policy: $err"
    fi

    if [ "$policy" = kv_aware_bridge ]; then
        start_engines "$out"
    else
        start_kvsim "$out.kvsim.log"
    fi

    NGINX_PREFIX=$prefix
    launch start nginx "$prefix" >"$out.nginx.log" 2>&1 \
        || die "nginx did not start: $(tail -3 "$out.nginx.log")"
    NGINX_PID=$(launch pid "$prefix" nginx)

    local k0 n0 t0 t1 rc=0 ids=()
    if [ "$policy" = kv_aware_bridge ] && [ "$BRIDGE_PROMPTS" = ids ]; then
        ids=(--prompt-ids 1)
    fi
    if [ "${KVLOAD_WL:-}" = sessions ]; then
        ids=(--sessions-log "$out.sessions.tsv")
    fi
    k0=$(cpu_ticks "$KVSIM_PID")
    n0=$(cpu_ticks "$NGINX_PID")
    t0=$(date +%s.%N)

    TIMEFORMAT='%U %S'
    # SIGINT: kvload stops sending and still writes what it measured
    { time timeout -s INT -k 120 "$RUN_LIMIT_S" "$KVLOAD" \
        --target "127.0.0.1:$NGINX_PORT" --workload "${KVLOAD_WL:-$wl}" \
        --time-scale "$SCALE" --seed 1 --label "$policy" "${ids[@]}" \
        --metrics "127.0.0.1:$KV_BASE-$(( KV_BASE + SERVERS - 1 ))" \
        --json "$out.json" --csv "$out.csv" "$@" \
        >"$out.txt" 2>"$out.err" ; } 2>"$out.time" || rc=$?

    t1=$(date +%s.%N)
    local k1 n1
    k1=$(cpu_ticks "$KVSIM_PID")
    n1=$(cpu_ticks "$NGINX_PID")

    case $policy in
    kv_aware*)
        curl -s -m 5 "http://127.0.0.1:$NGINX_PORT/kv_aware/status" \
            >"$out.status.json" || true ;;
    esac

    # kvsim's step lag over the run, every server's /metrics
    local k
    : >"$out.metrics"
    for k in $(seq 0 $(( SERVERS - 1 ))); do
        curl -s -m 5 "http://127.0.0.1:$(( KV_BASE + k ))/metrics" \
            >>"$out.metrics" || true
    done

    launch stop "$prefix" nginx
    NGINX_PREFIX=
    launch stop "$WORK" kvsim
    if [ "$policy" = kv_aware_bridge ]; then
        launch stop "$WORK" kvbridge
        launch stop "$WORK/tokenizer" kvsim
    fi

    if [ ! -s "$out.json" ]; then
        echo "$wl/$policy: kvload failed (rc $rc): $(tail -2 "$out.err")" \
            | tee -a "$WORK/skipped.txt"
        return 0
    fi
    if [ "$rc" = 124 ]; then
        echo "$wl/$policy: stopped at the ${RUN_LIMIT_S}s run limit," \
            "partial results" | tee -a "$WORK/skipped.txt"
    fi

    # the bounds of the requests this run sent, in its order
    if [ "${KVLOAD_WL:-}" = sessions ]; then
        "$PY" "$ROOT/bench/e2e/session_bounds.py" "$SESSIONS_FILE" \
            "$out.sessions.tsv" --pool-blocks $(( SERVERS * BLOCKS )) \
            ${AGENTS_SHARED:+--shared-prefix} --json "$out.bounds.json" \
            | sed 's/^/    bounds: /' || true
    fi

    local alerts
    alerts=$(grep -c -E '\[(alert|crit|emerg)\]' "$prefix/logs/error.log" \
             || true)

    "$PY" - "$out" "$t0" "$t1" "$k0" "$k1" "$n0" "$n1" "$SCALE" \
        "$(getconf CLK_TCK)" "$alerts" <<'EOF'
import json, sys
out, t0, t1, k0, k1, n0, n1, scale, hz, alerts = sys.argv[1:]
wall = float(t1) - float(t0)
hz = float(hz)
u, s = open(out + ".time").read().split()[-2:]
run = json.load(open(out + ".json"))
reqs = sum(st["completed"] + st["errors"] for st in run["stages"]) or 1
ngx = (int(n1) - int(n0)) / hz
meta = {
    "wall_s": wall, "time_scale": float(scale),
    "nginx_cpu_pct": 100 * ngx / wall,
    "kvsim_cpu_pct": 100 * (int(k1) - int(k0)) / hz / wall,
    "kvload_cpu_pct": 100 * (float(u) + float(s)) / wall,
    "nginx_us_per_req": 1e6 * ngx / reqs,
    "output_tokens": run["config"]["output-tokens"],
    "nginx_alerts": int(alerts),
}
# kvsim's step lag, real ms: the worst step of any server, the mean
lag = {}
for line in open(out + ".metrics"):
    if line.startswith("kvsim_step_lag"):
        name, v = line.split("{")[0], float(line.split()[-1])
        lag[name] = max(lag.get(name, 0.0), v) if "max" in name \
            else lag.get(name, 0.0) + v
if lag.get("kvsim_step_lag_steps_total"):
    meta["step_lag_max_ms"] = lag.get("kvsim_step_lag_max_ms", 0.0)
    meta["step_lag_mean_ms"] = (lag.get("kvsim_step_lag_ms_sum", 0.0)
                                / lag["kvsim_step_lag_steps_total"])
json.dump(meta, open(out + ".meta.json", "w"), indent=1)
print("    wall %.0fs  CPU: nginx %.0f%% (%.0f us/req)  kvsim %.0f%%  "
      "kvload %.0f%%  alerts %s  step lag %.1f ms max, %.2f mean" % (
      wall, meta["nginx_cpu_pct"], meta["nginx_us_per_req"],
      meta["kvsim_cpu_pct"], meta["kvload_cpu_pct"], alerts,
      meta.get("step_lag_max_ms", -1), meta.get("step_lag_mean_ms", -1)))
EOF
    sed -n '3,$p' "$out.txt" | sed 's/^/    /'
}

# ---------------------------------------------------------------------------

for f in "$KVSIM" "$KVLOAD"; do
    [ -x "$f" ] || die "$f is missing: run 'make tools' first"
done
[ -x "$NGINX" ] || die "$NGINX is missing"
command -v redis-server >/dev/null || die "redis-server is missing"
command -v gnuplot >/dev/null || die "gnuplot is missing"

mkdir -p "$WORK" "$RESULTS"
for wl in $WORKLOADS; do
    rm -rf "${WORK:?}/$wl"
    if [ "$wl" = agents ]; then
        rm -rf "${WORK:?}/agents-shared"
    fi
done
rm -rf "$WORK"/nginx-*
: >"$WORK/skipped.txt"

REDIS_PORT=$(free_port)
launch prefix "$WORK" >/dev/null
launch start redis "$WORK" "$REDIS_PORT" --logfile "$WORK/redis.log" \
    || die "redis-server did not start"

SP_ARGS="--groups $SP_GROUPS --prompts-per-group $PROMPTS"
SP_ARGS+=" --system-tokens $SYSTEM_TOKENS --question-tokens $QUESTION_TOKENS"
SP_ARGS+=" --output-tokens $OUTPUT_TOKENS --qps-ladder $LADDER"
SP_ARGS+=" --stage-requests $STAGE_REQUESTS --stage-seconds $STAGE_SECONDS"

log "e2e benchmark$([ $QUICK = 1 ] && echo ' (quick)'): policies: $POLICIES"
if [ -n "$SLOW_SERVERS" ]; then
    log "heterogeneous pool: servers $SLOW_SERVERS prefill $SLOW_FACTOR x" \
        "slower"
fi
log "kvsim: $SERVERS servers x $BLOCKS blocks x $BLOCK_TOKENS tokens," \
    "time scale $SCALE (min step 10 ms -> $(awk \
    "BEGIN { printf \"%.2f\", 10 / $SCALE }") ms)"
log "shared-prefix: $SP_GROUPS groups x $PROMPTS prompts (llm-d: 150 x 5)," \
    "$SYSTEM_TOKENS + $QUESTION_TOKENS in, $OUTPUT_TOKENS out (llm-d: 1000)," \
    "ladder $LADDER QPS, stages of ${STAGE_SECONDS}s uncompressed$(
    [ "$STAGE_REQUESTS" != 0 ] && echo " or $STAGE_REQUESTS requests")"

SERVERS0=$SERVERS SCALE0=$SCALE RUN_LIMIT0=$RUN_LIMIT_S BLOCKS0=$BLOCKS
# agents: one pass per variant, each its own directory
WL_LIST=
for wl in $WORKLOADS; do
    if [ "$wl" = agents ]; then
        for v in $AGENTS_VARIANTS; do
            case $v in
            apart) WL_LIST+=" agents" ;;
            shared) WL_LIST+=" agents-shared" ;;
            *) die "unknown AGENTS_VARIANTS entry $v (apart, shared)" ;;
            esac
        done
    else
        WL_LIST+=" $wl"
    fi
done
for wl in $WL_LIST; do
    SERVERS=$SERVERS0 SCALE=$SCALE0 RUN_LIMIT_S=$RUN_LIMIT0 WL_KV_PARAMS=
    CALIBRATION=0.1 KVLOAD_WL= BLOCKS=$BLOCKS0 AGENTS_SHARED=
    case $wl in
    shared-prefix) args=$SP_ARGS; pols=$POLICIES ;;
    multi-turn) args=$MT_ARGS; pols=$POLICIES ;;
    trace)
        [ -r "$TRACE_FILE" ] || die "no trace at $TRACE_FILE (TRACE_FILE)"
        SERVERS=$TRACE_SERVERS SCALE=$TRACE_SCALE pols=$POLICIES
        WL_KV_PARAMS=$TRACE_KV_PARAMS
        args="--trace $TRACE_FILE --trace-start $TRACE_START"
        args+=" --trace-seconds $TRACE_SECONDS"
        mkdir -p "$WORK/trace"
        echo "$SERVERS $BLOCKS $BLOCK_TOKENS $SCALE $TRACE_START" \
            "$TRACE_SECONDS $TRACE_KV_PARAMS" >"$WORK/trace/setup.txt"
        "$PY" "$ROOT/bench/e2e/trace_bounds.py" "$TRACE_FILE" \
            --start "$TRACE_START" --seconds "$TRACE_SECONDS" \
            --pool-tokens $(( SERVERS * BLOCKS * BLOCK_TOKENS )) \
            --block-tokens $BLOCK_TOKENS --json "$WORK/trace/bounds.json" \
            | sed 's/^/    /'
        log "trace: $TRACE_FILE, ${TRACE_SECONDS}s from ${TRACE_START}s," \
            "$SERVERS servers x $BLOCKS blocks, time scale $SCALE" ;;
    no-sharing)
        args=$NS_ARGS pols=""
        for p in $NS_POLICIES; do
            case " $POLICIES " in *" $p "*) pols+=" $p" ;; esac
        done ;;
    agent)
        args=$AG_ARGS pols=""
        for p in $AG_POLICIES; do
            case " $POLICIES " in *" $p "*) pols+=" $p" ;; esac
        done ;;
    agents|agents-shared)
        [ -r "$SESSIONS_FILE" ] \
            || die "no sessions at $SESSIONS_FILE (SESSIONS_FILE)"
        BLOCKS=$AGENTS_BLOCKS SCALE=$AGENTS_SCALE KVLOAD_WL=sessions
        RUN_LIMIT_S=$AGENTS_RUN_LIMIT_S
        WL_KV_PARAMS=learned_tokens=$(( BLOCKS * BLOCK_TOKENS ))
        if [ "$wl" = agents-shared ]; then
            AGENTS_SHARED=1
        fi
        args="--trace $SESSIONS_FILE --sessions $AGENTS_SESSIONS"
        args+=" --sessions-skip $AGENTS_SKIP --sessions-live $AGENTS_LIVE"
        args+=" --sessions-rate $AGENTS_RATE"
        args+=" --session-max-tokens $AGENTS_MAX_TOKENS"
        args+=" --session-requests $AGENTS_REQUESTS"
        args+=" --session-idle-max $AGENTS_IDLE_MAX --servers $SERVERS"
        args+=" --sessions-shared-prefix ${AGENTS_SHARED:-0}"
        pols=""
        for p in $AGENTS_POLICIES; do
            case " $POLICIES " in *" $p "*) pols+=" $p" ;; esac
        done
        mkdir -p "$WORK/$wl"
        echo "$SERVERS $BLOCKS $BLOCK_TOKENS $SCALE $AGENTS_SESSIONS" \
            "$AGENTS_LIVE $AGENTS_RATE $AGENTS_REQUESTS $AGENTS_IDLE_MAX" \
            "$AGENTS_MAX_TOKENS $AGENTS_SKIP ${AGENTS_SHARED:-0}" \
            "$WL_KV_PARAMS" >"$WORK/$wl/setup.txt"
        log "$wl: $AGENTS_SESSIONS sessions (${AGENTS_LIVE} live," \
            "$AGENTS_RATE/s, first $AGENTS_REQUESTS requests, under" \
            "$AGENTS_MAX_TOKENS tokens), $SERVERS servers x $BLOCKS blocks," \
            "time scale $SCALE" ;;
    llm-d)
        args="$LLMD_ARGS --warmup $LLMD_WARMUP --qps-ladder $LLMD_LADDER"
        pols="" CALIBRATION=llm-d KVLOAD_WL=shared-prefix
        SCALE=$LLMD_SCALE
        [ "$QUICK" = 1 ] || RUN_LIMIT_S=$LLMD_RUN_LIMIT_S
        for p in $LLMD_POLICIES; do
            case " $POLICIES " in *" $p "*) pols+=" $p" ;; esac
        done
        log "llm-d: 8 servers calibrated to llm-d's pods," \
            "warm-up $LLMD_WARMUP, ladder $LLMD_LADDER," \
            "$LLMD_OUTPUT_TOKENS out, time scale $SCALE" ;;
    *) die "unknown workload $wl" ;;
    esac
    for p in $pols; do
        log "$wl / $p"
        # shellcheck disable=SC2086
        run_one "$wl" "$p" $args
    done
done

# a run of the trace or of llm-d alone reports on that alone; any other
# reports on what every earlier run left in $WORK too
only=()
case $WORKLOADS in trace|llm-d|agents) only=("$WORKLOADS") ;; esac
NCOLS=$("$PY" "$ROOT/bench/e2e/report.py" "$WORK" "$RESULTS" "${only[@]}")
if [ -n "$NCOLS" ] && [ -s "$WORK/ttft-p90.dat" ]; then
    gnuplot -e "datafile='$WORK/ttft-p90.dat'; \
        outfile='$RESULTS/e2e-ttft-p90.png'; ncols=$NCOLS; \
        subtitle='kvsim $SERVERS x $BLOCKS x $BLOCK_TOKENS, time scale \
$SCALE, $SP_GROUPS x $PROMPTS prompts'" \
        "$ROOT/bench/e2e/plot.gp"
fi

log "done in $(( $(date +%s) - T0 ))s: $RESULTS/e2e-summary.md," \
    "e2e-<policy>.md, e2e-all.csv, e2e-ttft-p90.png"
if [ -s "$WORK/skipped.txt" ]; then
    log "skipped:"
    sed 's/^/    /' "$WORK/skipped.txt"
fi
