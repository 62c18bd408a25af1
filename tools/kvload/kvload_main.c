/*
 * kvload: open-loop load generator for OpenAI-compatible LLM servers.
 *
 * Poisson arrivals on a ladder of QPS stages; every request streams (SSE)
 * and is timed to its first content chunk (TTFT), its last one, and its
 * end.  Requests over the in-flight cap are dropped and counted, never
 * queued, so a slow server cannot slow the arrivals down.
 *
 * Time compression: with --time-scale S the simulated servers run S times
 * faster than real GPUs, so kvload sends at S x QPS per real second and
 * multiplies every measured duration by S when it reports.  Reported
 * seconds, QPS and tokens/s therefore read as uncompressed (real GPU)
 * figures; --stage-seconds, --timeout and --drain-seconds are uncompressed
 * too.  Client and proxy overhead is scaled as well: 1 ms of real overhead
 * reads as S ms.
 */

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kvload.h"
#include "kvload_agent.h"
#include "kvload_sessions.h"


static int kvl_options(int argc, char **argv);
static int kvl_option(kvl_opt_t *opt, const char *v);
static int kvl_ladder(const char *s, unsigned warmup);
static int kvl_metrics_targets(const char *s);


static kvl_ctx_t  ctx;
static kvl_agent_conf_t  agent;
static kvl_ss_conf_t     sessions;

static kvl_opt_t  kvl_opts[] = {
    { "target", 's', &ctx.target, "127.0.0.1:8080", "HOST:PORT" },
    { "workload", 's', &ctx.workload, "shared-prefix",
      "shared-prefix | multi-turn | no-sharing | agent | sessions | trace" },
    { "qps-ladder", 's', &ctx.ladder, "3,10,20,40,60",
      "QPS[:SECONDS] per stage" },
    { "warmup", 's', &ctx.warmup, "", "QPS:SECONDS first, marked warmup" },
    { "stage-requests", 'U', &ctx.stage_requests, "0",
      "requests per stage at most (0: no cap)" },
    { "stage-seconds", 'd', &ctx.stage_seconds, "60", "seconds per stage" },
    { "time-scale", 'd', &ctx.scale, "1", "the servers run S x faster" },
    { "groups", 'u', &ctx.wl.groups, "150", "groups or conversations" },
    { "prompts-per-group", 'u', &ctx.wl.prompts_per_group, "5", "" },
    { "turns", 'u', &ctx.wl.turns, "5", "multi-turn: user turns" },
    { "system-tokens", 'u', &ctx.wl.system_tokens, "6000", "" },
    { "question-tokens", 'u', &ctx.wl.question_tokens, "1200", "" },
    { "output-tokens", 'u', &ctx.wl.output_tokens, "1000", "max_tokens" },
    { "model", 's', &ctx.wl.model, "kvsim", "" },
    { "prompt-ids", 'u', &ctx.wl.prompt_ids, "0",
      "1: /v1/completions, prompts as token ids (no tokenizer needed)" },
    { "concurrency", 'u', &agent.concurrency, "0",
      "agent: conversations open at once (0: all)" },
    { "tool-tokens", 'u', &agent.tool_tokens, "800",
      "agent: tool result a turn" },
    { "think-ms", 'd', &agent.think_ms, "3000",
      "agent: mean think time between turns" },
    { "servers", 'u', &agent.servers, "0",
      "agent, sessions: servers behind the target (0: those answering)" },
    { "seed", 'U', &ctx.wl.seed, "1", "prompts and arrivals" },
    { "max-inflight", 'U', &ctx.max_inflight, "2048", "drop beyond" },
    { "timeout", 'd', &ctx.timeout, "600", "idle seconds per request" },
    { "drain-seconds", 'd', &ctx.drain_seconds, "0",
      "wait for a stage's requests before the next (0: do not)" },
    { "metrics", 's', &ctx.metrics, NULL,
      "HOST:PORT[-PORT]: scrape vllm:num_requests_waiting" },
    { "metrics-interval-ms", 'u', &ctx.metrics_ms, "250", "real time" },
    { "json", 's', &ctx.json, NULL, "write results as JSON" },
    { "csv", 's', &ctx.csv, NULL, "write results as CSV, a row per stage" },
    { "label", 's', &ctx.label, "", "a name for this run" },
    { "trace", 's', &ctx.tc.path, NULL,
      "trace: a Mooncake-format trace (JSON lines); sessions: a .tar.gz" },
    { "trace-dir", 's', &sessions.dir, NULL,
      "sessions: a directory of session files" },
    { "sessions", 'U', &sessions.count, "0",
      "sessions: how many are replayed (0: all)" },
    { "sessions-skip", 'U', &sessions.skip, "0",
      "sessions: the first ones selected are skipped" },
    { "sessions-live", 'u', &sessions.live, "0",
      "sessions: open at once at most (0: no cap)" },
    { "sessions-rate", 'd', &sessions.rate, "0",
      "sessions: arrivals a second, Poisson (0: as soon as one may)" },
    { "sessions-shared-prefix", 'u', &sessions.shared_prefix, "0",
      "sessions: 1: system + tool tokens the same text in all (assumed)" },
    { "session-max-tokens", 'U', &sessions.max_tokens, "0",
      "sessions: leave out those with a longer prompt (0: none)" },
    { "session-requests", 'u', &sessions.requests, "0",
      "sessions: each one's first requests only (0: all)" },
    { "session-idle-max", 'd', &sessions.idle_max, "0",
      "sessions: longer pauses shortened to this (0: kept)" },
    { "session-header", 's', &sessions.header, "x-session-affinity",
      "sessions: the header carrying the session's id (\"\": none)" },
    { "sessions-log", 's', &sessions.log, NULL,
      "sessions: a line per request sent: session, index, seconds" },
    { "trace-start", 'd', &ctx.tc.start, "0", "trace seconds skipped" },
    { "trace-seconds", 'd', &ctx.tc.seconds, "0",
      "window, trace seconds (0: to the end)" },
    { "trace-count", 'U', &ctx.tc.count, "0", "requests at most (0: all)" },
    { "trace-max-lines", 'u', &ctx.tc.max_lines, "10000000",
      "lines read at most" },
    { NULL, 0, NULL, NULL, NULL }
};


int
main(int argc, char **argv)
{
    int             rc, closed;
    unsigned        i;
    json_t         *res;
    struct rlimit   rl;

    ctx.base = event_base_new();

    if (ctx.base == NULL || kvl_options(argc, argv) != 0) {
        return 2;
    }

    /* every request in flight holds a socket, through a proxy two */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void) setrlimit(RLIMIT_NOFILE, &rl);
    }

    signal(SIGPIPE, SIG_IGN);

    closed = ctx.wl.kind == KVL_WL_AGENT || ctx.wl.kind == KVL_WL_SESSIONS;
    ctx.work = closed ? NULL : kvl_workload_create(&ctx.wl);

    if (ctx.tc.path && !closed && kvl_trace_setup(&ctx) != 0) {
        return 1;
    }

    if ((ctx.work == NULL && !closed) || kvl_run_init(&ctx) != 0) {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    if (ctx.wl.kind == KVL_WL_SESSIONS) {
        sessions.tar = ctx.tc.path;
        sessions.servers = agent.servers;
        rc = kvl_ss_run(&ctx, &sessions);

        if (rc != 0 && ctx.stages[0].t_start == 0.0) {
            return 1;                   /* nothing was sent */
        }

    } else {
        rc = ctx.wl.kind == KVL_WL_AGENT ? kvl_agent_run(&ctx, &agent)
                                         : kvl_run(&ctx);
    }

    res = kvl_report_json(&ctx, kvl_opts);
    if (res == NULL) {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    kvl_report_print(&ctx, json_object_get(res, "stages"));

    if ((ctx.wl.kind == KVL_WL_AGENT && kvl_agent_report(&ctx, res) != 0)
        || (ctx.wl.kind == KVL_WL_SESSIONS && kvl_ss_report(&ctx, res) != 0))
    {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    if (ctx.json
        && json_dump_file(res, ctx.json,
                          JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0)
    {
        fprintf(stderr, "kvload: cannot write %s\n", ctx.json);
        rc = 1;
    }

    if (ctx.csv && kvl_report_csv(ctx.csv,
                                    json_object_get(res, "stages")) != 0)
    {
        rc = 1;
    }

    json_decref(res);
    kvl_workload_free(ctx.work);
    kvl_trace_free(ctx.trace);

    for (i = 0; i < ctx.nstages; i++) {
        kvl_stage_free(&ctx.stages[i]);
    }

    /* connections and events go with the process */

    return rc == 0 ? 0 : 1;
}


static int
kvl_options(int argc, char **argv)
{
    int             c, n;
    const char     *p;
    kvl_opt_t      *opt;
    struct option   lo[sizeof(kvl_opts) / sizeof(kvl_opt_t)];
    static const char  *kinds[] = {
        "shared-prefix", "multi-turn", "no-sharing", "agent", "sessions"
    };                                          /* kvl_wl_kind_e */

    for (n = 0; kvl_opts[n].name; n++) {
        lo[n].name = kvl_opts[n].name;
        lo[n].has_arg = required_argument;
        lo[n].flag = NULL;
        lo[n].val = 256 + n;

        if (kvl_opts[n].dflt) {
            (void) kvl_option(&kvl_opts[n], kvl_opts[n].dflt);
        }
    }

    memset(&lo[n], 0, sizeof(struct option));

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c < 256 || kvl_option(&kvl_opts[c - 256], optarg) != 0) {
            goto usage;
        }
    }

    for (n = 0; n < 5 && strcmp(ctx.workload, kinds[n]) != 0; n++) {
        /* void */
    }

    /* --trace with trace or sessions, --trace-dir with sessions: one */
    if (n == KVL_WL_SESSIONS
        ? (ctx.tc.path != NULL) == (sessions.dir != NULL)
        : (ctx.tc.path != NULL) != (strcmp(ctx.workload, "trace") == 0)
          || sessions.dir != NULL)
    {
        goto usage;
    }

    n = ctx.tc.path && n != KVL_WL_SESSIONS ? 0 : n;    /* the trace */
    ctx.wl.kind = (kvl_wl_kind_e) n;

    for (p = ctx.wl.model; *p; p++) {
        if (*p == '"' || *p == '\\' || (unsigned char) *p < 0x20) {
            goto usage;                 /* must need no JSON escaping */
        }
    }

    if (optind != argc || n == 5 || ctx.scale <= 0.0
        || ctx.stage_seconds <= 0.0 || ctx.timeout <= 0.0
        || ctx.max_inflight == 0 || ctx.metrics_ms == 0
        || ctx.wl.groups == 0 || ctx.wl.prompts_per_group == 0
        || ctx.wl.turns == 0 || ctx.wl.output_tokens == 0
        || ctx.wl.system_tokens == 0 || ctx.wl.question_tokens == 0
        || (n == KVL_WL_AGENT && (ctx.wl.prompt_ids || agent.think_ms < 0))
        || ((n >= KVL_WL_AGENT || ctx.tc.path) && ctx.warmup[0])
        || (n == KVL_WL_SESSIONS && (ctx.wl.prompt_ids
                                     || sessions.idle_max < 0.0
                                     || sessions.rate < 0.0))
        || (sessions.header && strpbrk(sessions.header, ": \r\n") != NULL)
        || strlen(ctx.wl.model) > 128
        || (ctx.warmup[0] && kvl_ladder(ctx.warmup, 1) != 0)
        || kvl_ladder(ctx.ladder, 0) != 0)
    {
        goto usage;
    }

    if (kvl_target_init(&ctx.server, ctx.base, ctx.target, ctx.max_inflight)
        != 0 || (ctx.metrics && kvl_metrics_targets(ctx.metrics) != 0))
    {
        fprintf(stderr, "kvload: bad address in --target or --metrics\n");
        return -1;
    }

    return 0;

usage:

    fprintf(stderr, "usage: kvload [--option value]...\n");

    for (opt = kvl_opts; opt->name; opt++) {
        fprintf(stderr, "  --%-20s %s%s%s%s\n", opt->name, opt->help,
                opt->dflt && opt->dflt[0] ? " (" : "",
                opt->dflt ? opt->dflt : "", opt->dflt && opt->dflt[0] ? ")"
                                                                 : "");
    }

    fprintf(stderr, "Durations in and out are uncompressed (measured x S): "
            "see kvload_main.c.\n");

    return -1;
}


static int
kvl_option(kvl_opt_t *opt, const char *v)
{
    char  *end = "";

    errno = 0;

    switch (opt->type) {
    case 's': *(const char **) opt->p = v; break;
    case 'd': *(double *) opt->p = strtod(v, &end); break;
    case 'u': *(unsigned *) opt->p = strtoul(v, &end, 10); break;
    default: *(uint64_t *) opt->p = strtoull(v, &end, 10);
    }

    if (*end != '\0' || errno != 0 || (opt->type != 's' && v[0] == '-')) {
        fprintf(stderr, "kvload: bad --%s \"%s\"\n", opt->name, v);
        return -1;
    }

    return 0;
}


/*
 * "3,10:20,60": a stage per QPS, each as long as --stage-seconds unless
 * ":SECONDS" says otherwise (llm-d's ladder gives each stage its own
 * length); warmup: one stage, QPS:SECONDS, that the report keeps apart
 */

static int
kvl_ladder(const char *s, unsigned warmup)
{
    char         *end;
    double        qps, sec;
    kvl_stage_t  *st;

    for ( ;; ) {
        qps = strtod(s, &end);
        sec = 0.0;

        if (*end == ':') {
            s = end + 1;
            sec = strtod(s, &end);

            if (end == s || !(sec > 0.0)) {
                return -1;
            }

        } else if (warmup) {
            return -1;
        }

        if (end == s || !(qps > 0.0) || ctx.nstages == KVL_MAX_STAGES
            || (*end != ',' && *end != '\0') || (warmup && *end == ','))
        {
            return -1;
        }

        st = &ctx.stages[ctx.nstages++];
        st->qps = qps;
        st->seconds = sec;
        st->warmup = warmup;

        if (*end == '\0') {
            return 0;
        }

        s = end + 1;
    }
}


static int
kvl_metrics_targets(const char *s)
{
    char        host[80];
    const char *colon = strrchr(s, ':'), *dash = strrchr(s, '-');
    long        port, last;

    /* host:port or host:first-last */

    if (colon == NULL || colon - s > 48) {
        return -1;
    }

    port = strtol(colon + 1, NULL, 10);
    last = dash ? strtol(dash + 1, NULL, 10) : port;

    for ( /* void */ ; port <= last; port++) {
        snprintf(host, sizeof(host), "%.*s:%ld", (int) (colon - s), s, port);

        if (ctx.nmetrics == KVL_MAX_METRICS
            || kvl_target_init(&ctx.mtargets[ctx.nmetrics], ctx.base, host, 1)
               != 0)
        {
            return -1;
        }

        ctx.mreqs[ctx.nmetrics].target = &ctx.mtargets[ctx.nmetrics];
        ctx.nmetrics++;
    }

    return 0;
}
