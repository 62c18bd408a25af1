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

#define _GNU_SOURCE                     /* memmem() */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <jansson.h>

#include "kvload_http.h"
#include "kvload_stats.h"
#include "kvload_workload.h"


#define KVL_MAX_STAGES    64
#define KVL_MAX_METRICS   64
#define KVL_TICK_US       20000
#define KVL_MAX_ERRLOG    10


typedef struct {
    kvl_http_req_t      http;
    kvl_stage_t        *stage;
    double              t_arrival;
    double              t_first;
    double              t_last;
    uint64_t            chunks;
    uint64_t            completion_tokens;
    uint64_t            prompt_tokens;
    uint64_t            cached_tokens;
    unsigned            failed:1;
    char                backend[KVL_BACKEND_LEN];
} kvl_request_t;


typedef struct {
    const char         *name;
    char                type;           /* s, d(ouble), u(nsigned), U64 */
    void               *p;
    const char         *dflt;
    const char         *help;
} kvl_opt_t;


typedef struct {
    const char         *target;
    const char         *workload;
    const char         *ladder;
    const char         *metrics;
    const char         *json;
    const char         *csv;
    const char         *label;
    double              scale;
    double              stage_seconds;
    double              timeout;
    double              drain_seconds;
    uint64_t            stage_requests;
    uint64_t            max_inflight;
    unsigned            metrics_ms;
    kvl_wl_conf_t       wl;
    struct event_base  *base;
    kvl_target_t        server;
    kvl_target_t        mtargets[KVL_MAX_METRICS];
    kvl_http_req_t      mreqs[KVL_MAX_METRICS];
    unsigned            nmetrics;
    unsigned            mpending;
    unsigned            mok;
    double              mwaiting;
    double              mlast;
    kvl_workload_t     *work;
    kvl_stage_t         stages[KVL_MAX_STAGES];
    unsigned            nstages;
    unsigned            cur;
    int                 arriving;
    int                 stopping;
    unsigned            errlog;
    uint64_t            rng;
    uint64_t            inflight;
    double              next_arrival;
    double              t_stage_end;
    struct event       *arrival;
    struct event       *tick;
    struct event       *sigint;
} kvl_ctx_t;


static int kvl_options(int argc, char **argv);
static int kvl_option(kvl_opt_t *opt, const char *v);
static int kvl_ladder(const char *s);
static int kvl_metrics_targets(const char *s);
static void kvl_stage_begin(double now);
static void kvl_arrive(evutil_socket_t fd, short what, void *arg);
static void kvl_issue(kvl_stage_t *st, double t);
static void kvl_on_event(kvl_http_req_t *hr, const char *d, size_t len,
    double now);
static const char *kvl_json_value(const char *d, size_t len, const char *key);
static void kvl_on_done(kvl_http_req_t *hr);
static void kvl_tick(evutil_socket_t fd, short what, void *arg);
static void kvl_scrape_done(kvl_http_req_t *hr);
static void kvl_on_signal(evutil_socket_t fd, short what, void *arg);
static json_t *kvl_results(void);
static void kvl_print(json_t *stages);
static int kvl_write_csv(const char *path, json_t *stages);


static kvl_ctx_t  ctx;

static kvl_opt_t  kvl_opts[] = {
    { "target", 's', &ctx.target, "127.0.0.1:8080", "HOST:PORT" },
    { "workload", 's', &ctx.workload, "shared-prefix",
      "shared-prefix | multi-turn | no-sharing" },
    { "qps-ladder", 's', &ctx.ladder, "3,10,20,40,60", "QPS per stage" },
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
    { NULL, 0, NULL, NULL, NULL }
};


int
main(int argc, char **argv)
{
    int             rc;
    unsigned        i;
    json_t         *res;
    struct rlimit   rl;
    struct timeval  tv = { 0, KVL_TICK_US };

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

    ctx.work = kvl_workload_create(&ctx.wl);
    ctx.arrival = evtimer_new(ctx.base, kvl_arrive, NULL);
    ctx.tick = event_new(ctx.base, -1, EV_PERSIST, kvl_tick, NULL);
    ctx.sigint = evsignal_new(ctx.base, SIGINT, kvl_on_signal, NULL);

    if (ctx.work == NULL || ctx.arrival == NULL || ctx.tick == NULL
        || ctx.sigint == NULL || event_add(ctx.tick, &tv) != 0
        || event_add(ctx.sigint, NULL) != 0)
    {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    ctx.rng = ctx.wl.seed ^ 0x6172726976616c73ULL;

    kvl_stage_begin(kvl_now());

    rc = event_base_dispatch(ctx.base);

    res = kvl_results();
    if (res == NULL) {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    kvl_print(json_object_get(res, "stages"));

    if (ctx.json
        && json_dump_file(res, ctx.json,
                          JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0)
    {
        fprintf(stderr, "kvload: cannot write %s\n", ctx.json);
        rc = 1;
    }

    if (ctx.csv && kvl_write_csv(ctx.csv,
                                   json_object_get(res, "stages")) != 0)
    {
        rc = 1;
    }

    json_decref(res);
    kvl_workload_free(ctx.work);

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
        "shared-prefix", "multi-turn", "no-sharing"   /* kvl_wl_kind_e */
    };

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

    for (n = 0; n < 3 && strcmp(ctx.workload, kinds[n]) != 0; n++) {
        /* void */
    }

    ctx.wl.kind = (kvl_wl_kind_e) n;

    for (p = ctx.wl.model; *p; p++) {
        if (*p == '"' || *p == '\\' || (unsigned char) *p < 0x20) {
            goto usage;                 /* must need no JSON escaping */
        }
    }

    if (optind != argc || n == 3 || ctx.scale <= 0.0 || ctx.stage_seconds <= 0.0
        || ctx.timeout <= 0.0 || ctx.max_inflight == 0 || ctx.metrics_ms == 0
        || ctx.wl.groups == 0 || ctx.wl.prompts_per_group == 0
        || ctx.wl.turns == 0 || ctx.wl.output_tokens == 0
        || ctx.wl.system_tokens == 0 || ctx.wl.question_tokens == 0
        || strlen(ctx.wl.model) > 128 || kvl_ladder(ctx.ladder) != 0)
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


static int
kvl_ladder(const char *s)
{
    char    *end;
    double   qps;

    for ( ;; ) {
        qps = strtod(s, &end);

        if (end == s || qps <= 0.0 || ctx.nstages == KVL_MAX_STAGES
            || (*end != ',' && *end != '\0'))
        {
            return -1;
        }

        ctx.stages[ctx.nstages++].qps = qps;

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
        ctx.mreqs[ctx.nmetrics++].done = kvl_scrape_done;
    }

    return 0;
}


static void
kvl_stage_begin(double now)
{
    kvl_stage_t     *st = &ctx.stages[ctx.cur];
    struct timeval   tv = { 0, 0 };

    st->t_start = now;
    ctx.t_stage_end = now + ctx.stage_seconds / ctx.scale;
    ctx.next_arrival = now - log(kvl_rand_unit(&ctx.rng))
                             / (st->qps * ctx.scale);
    ctx.arriving = 1;

    evtimer_add(ctx.arrival, &tv);
}


static void
kvl_arrive(evutil_socket_t fd, short what, void *arg)
{
    double           now, next;
    kvl_stage_t     *st = &ctx.stages[ctx.cur];
    struct timeval   tv;

    now = kvl_now();

    while (!ctx.stopping && ctx.next_arrival <= now
           && ctx.next_arrival <= ctx.t_stage_end
           && (ctx.stage_requests == 0
               || st->sent + st->dropped < ctx.stage_requests))
    {
        kvl_issue(st, ctx.next_arrival);
        ctx.next_arrival -= log(kvl_rand_unit(&ctx.rng))
                            / (st->qps * ctx.scale);
    }

    next = ctx.next_arrival < ctx.t_stage_end ? ctx.next_arrival
                                              : ctx.t_stage_end;

    if (ctx.stopping || now >= ctx.t_stage_end || (ctx.stage_requests
                             && st->sent + st->dropped >= ctx.stage_requests))
    {
        st->t_arrivals_end = now < ctx.t_stage_end ? now : ctx.t_stage_end;
        ctx.arriving = 0;
        return;
    }

    tv.tv_sec = (time_t) (next - now);
    tv.tv_usec = (suseconds_t) ((next - now - (double) tv.tv_sec) * 1e6);

    evtimer_add(ctx.arrival, &tv);
}


static void
kvl_issue(kvl_stage_t *st, double t)
{
    int             rc;
    size_t          len;
    const char     *body;
    kvl_request_t  *rq;

    /* the workload advances even for a drop: same prompts for everyone */

    rc = kvl_workload_next(ctx.work, &body, &len);

    if (ctx.inflight >= ctx.max_inflight) {
        st->dropped++;
        return;
    }

    st->sent++;

    rq = rc == 0 ? calloc(1, sizeof(kvl_request_t)) : NULL;
    if (rq == NULL) {
        st->errors++;
        return;
    }

    rq->stage = st;
    rq->t_arrival = t;
    rq->http.target = &ctx.server;
    rq->http.on_event = kvl_on_event;
    rq->http.done = kvl_on_done;
    rq->http.data = rq;

    if (kvl_http_send(&rq->http, "/v1/chat/completions", body, len,
                      ctx.timeout / ctx.scale)
        != 0)
    {
        st->errors++;

        if (rq->http.buf) {
            evbuffer_free(rq->http.buf);
        }

        if (rq->http.again) {
            evbuffer_free(rq->http.again);
        }

        free(rq);
        return;
    }

    st->inflight++;
    ctx.inflight++;
}


static void
kvl_on_event(kvl_http_req_t *hr, const char *d, size_t len, double now)
{
    const char     *v, *server;
    json_t         *root;
    json_int_t      pt = 0, ct = 0, cached = 0;
    kvl_request_t  *rq = hr->data;

    v = kvl_json_value(d, len, "\"content\"");

    if (v != NULL && v[0] == '"' && v[1] != '"') {
        if (rq->chunks++ == 0) {
            rq->t_first = now;
        }

        rq->t_last = now;
        ctx.stages[ctx.cur].window_tokens += ctx.arriving;
    }

    /* only the rare chunks worth a real JSON parse */

    v = kvl_json_value(d, len, "\"usage\"");

    if ((v == NULL || *v != '{')
        && (rq->backend[0] || memmem(d, len, "\"kvsim\"", 7) == NULL)
        && kvl_json_value(d, len, "\"error\"") == NULL)
    {
        return;
    }

    root = json_loadb(d, len, 0, NULL);

    if (root == NULL || json_is_object(json_object_get(root, "error"))) {
        rq->failed = 1;
    }

    if (json_unpack(root, "{s:{s:s}}", "kvsim", "server", &server) == 0) {
        snprintf(rq->backend, sizeof(rq->backend), "%s", server);
    }

    if (json_unpack(root, "{s:{s?I, s?I, s?{s?I}}}", "usage",
                    "prompt_tokens", &pt, "completion_tokens", &ct,
                    "prompt_tokens_details", "cached_tokens", &cached)
        == 0)
    {
        rq->prompt_tokens = pt;
        rq->completion_tokens = ct;
        rq->cached_tokens = cached;
    }

    json_decref(root);
}


static const char *
kvl_json_value(const char *d, size_t len, const char *key)
{
    const char  *p, *end = d + len;
    size_t       klen = strlen(key);

    /* the value after "key": without a parse; prompts hold no quotes */

    p = memmem(d, len, key, klen);
    if (p == NULL) {
        return NULL;
    }

    for (p += klen; p < end && (*p == ' ' || *p == ':'); p++) {
        /* void */
    }

    return p + 1 < end ? p : NULL;
}


static void
kvl_on_done(kvl_http_req_t *hr)
{
    uint64_t        tokens;
    kvl_stage_t    *st;
    kvl_request_t  *rq = hr->data;

    st = rq->stage;
    st->inflight--;
    ctx.inflight--;

    tokens = rq->completion_tokens ? rq->completion_tokens : rq->chunks;

    if (hr->error != 0 || hr->status != 200 || rq->failed
        || rq->chunks == 0)
    {
        st->errors++;
        st->timeouts += (hr->error == KVL_HTTP_ETIMEOUT);
        st->http_5xx += (hr->status >= 500);
        st->cut += (hr->status == 200);

        if (ctx.errlog++ < KVL_MAX_ERRLOG) {
            fprintf(stderr, "kvload: request failed: %s, HTTP %d%s\n",
                    kvl_http_strerror(hr->error), hr->status,
                    rq->failed ? ", error in stream" : "");
        }

    } else if (kvl_samples_add(&st->ttft, rq->t_first - rq->t_arrival) != 0
               || kvl_samples_add(&st->e2e, hr->t_done - rq->t_arrival) != 0
               || (tokens > 1 && rq->t_last > rq->t_first
                   && kvl_samples_add(&st->itl, (rq->t_last - rq->t_first)
                                                / (double) (tokens - 1))
                      != 0))
    {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);

    } else {
        st->completed++;
        st->output_tokens += tokens;
        st->prompt_tokens += rq->prompt_tokens;
        st->cached_tokens += rq->cached_tokens;
        kvl_stage_backend(st, rq->backend[0] ? rq->backend : hr->upstream);
    }

    st->retried += hr->retries;

    evbuffer_free(hr->buf);

    if (hr->again) {
        evbuffer_free(hr->again);
    }

    free(rq);
}


static void
kvl_tick(evutil_socket_t fd, short what, void *arg)
{
    unsigned      i;
    double        now;
    kvl_stage_t  *st = &ctx.stages[ctx.cur];

    now = kvl_now();

    if (!ctx.arriving) {
        if (ctx.cur + 1 < ctx.nstages && !ctx.stopping) {
            if (st->inflight == 0 || (now - st->t_arrivals_end) * ctx.scale
                                     >= ctx.drain_seconds)
            {
                ctx.cur++;
                kvl_stage_begin(now);
            }

        } else if (ctx.inflight == 0 && ctx.mpending == 0) {
            event_base_loopexit(ctx.base, NULL);
            return;
        }
    }

    if (ctx.nmetrics == 0 || ctx.mpending || (!ctx.arriving && !ctx.inflight)
        || now - ctx.mlast < ctx.metrics_ms / 1000.0)
    {
        return;
    }

    ctx.mlast = now;
    ctx.mok = 0;
    ctx.mwaiting = 0.0;

    for (i = 0; i < ctx.nmetrics; i++) {
        if (kvl_http_send(&ctx.mreqs[i], "/metrics", NULL, 0, 2.0) == 0) {
            ctx.mpending++;
        }
    }
}


static void
kvl_scrape_done(kvl_http_req_t *hr)
{
    char          *line, *v;
    size_t         n;
    kvl_stage_t   *st = &ctx.stages[ctx.cur];

    while ((line = evbuffer_readln(hr->buf, &n, EVBUFFER_EOL_ANY)) != NULL) {
        v = strrchr(line, ' ');

        if (v && strncmp(line, "vllm:num_requests_waiting", 25) == 0) {
            ctx.mwaiting += atof(v + 1);
        }

        free(line);
    }

    ctx.mok += (hr->error == 0 && hr->status == 200);

    if (--ctx.mpending == 0 && ctx.mok) {
        /* per-server means, like llm-d's "mean wait queue" */
        st->waiting_sum += ctx.mwaiting / ctx.mok;
        st->scrapes++;
    }
}


static void
kvl_on_signal(evutil_socket_t fd, short what, void *arg)
{
    if (ctx.stopping) {
        event_base_loopbreak(ctx.base);
        return;
    }

    fprintf(stderr, "kvload: stopping; interrupt again to quit now\n");

    ctx.stopping = 1;
}


static json_t *
kvl_results(void)
{
    size_t          b;
    unsigned        i;
    json_t         *root, *conf, *stages, *o, *be, *v;
    kvl_opt_t      *opt;
    kvl_stage_t    *st;
    kvl_summary_t   s;

    root = json_object();
    conf = json_object();
    stages = json_array();

    if (root == NULL || conf == NULL || stages == NULL
        || json_object_set_new(root, "config", conf) != 0
        || json_object_set_new(root, "stages", stages) != 0)
    {
        return NULL;
    }

    for (opt = kvl_opts; opt->name; opt++) {
        switch (opt->type) {
        case 's':
            v = *(char **) opt->p ? json_string(*(char **) opt->p)
                                  : json_null();
            break;
        case 'd': v = json_real(*(double *) opt->p); break;
        case 'u': v = json_integer(*(unsigned *) opt->p); break;
        default: v = json_integer((json_int_t) *(uint64_t *) opt->p);
        }

        if (json_object_set_new(conf, opt->name, v) != 0) {
            goto failed;
        }
    }

    for (i = 0; i <= ctx.cur && i < ctx.nstages; i++) {
        st = &ctx.stages[i];
        kvl_stage_summarize(st, ctx.scale, &s);

        o = json_pack("{s:s, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I,"
                      " s:I, s:I, s:f,"
                      " s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I,"
                      " s:f, s:f, s:I, s:{}}",
                      "label", ctx.label, "workload", ctx.workload,
                      "time_scale", ctx.scale, "qps", st->qps,
                      "sent", (json_int_t) st->sent,
                      "completed", (json_int_t) st->completed,
                      "errors", (json_int_t) st->errors,
                      "timeouts", (json_int_t) st->timeouts,
                      "http_5xx", (json_int_t) st->http_5xx,
                      "cut", (json_int_t) st->cut,
                      "retried", (json_int_t) st->retried,
                      "dropped", (json_int_t) st->dropped,
                      "achieved_qps", s.achieved_qps,
                      "ttft_p50", s.ttft_p50, "ttft_p90", s.ttft_p90,
                      "ttft_p99", s.ttft_p99, "itl_p50", s.itl_p50,
                      "e2e_p50", s.e2e_p50, "gen_tok_s", s.gen_tok_s,
                      "output_tokens", (json_int_t) st->output_tokens,
                      "window_tokens", (json_int_t) st->window_tokens,
                      "prompt_tokens", (json_int_t) st->prompt_tokens,
                      "cached_tokens", (json_int_t) st->cached_tokens,
                      "hit_rate", s.hit_rate,
                      "queue_waiting_mean", s.waiting_mean,
                      "backend_unknown", (json_int_t) st->backend_unknown,
                      "backends");

        if (o == NULL || json_array_append_new(stages, o) != 0) {
            goto failed;
        }

        be = json_object_get(o, "backends");

        for (b = 0; b < st->nbackends; b++) {
            if (json_object_set_new(be, st->backends[b].name,
                    json_integer((json_int_t) st->backends[b].requests))
                != 0)
            {
                goto failed;
            }
        }
    }

    return root;

failed:

    json_decref(root);
    return NULL;
}


static void
kvl_print(json_t *stages)
{
    size_t              i, k;
    json_t             *st;
    static const char  *cols[] = {           /* key, heading */
        "qps", "qps", "sent", "sent", "completed", "ok", "errors", "err",
        "dropped", "drop", "achieved_qps", "ach.qps", "ttft_p50", "ttft50",
        "ttft_p90", "ttft90", "ttft_p99", "ttft99", "itl_p50", "itl50",
        "e2e_p50", "e2e50", "gen_tok_s", "tok/s", "hit_rate", "hit",
        "queue_waiting_mean", "waitq", NULL
    };

    printf("# kvload %s %s, time scale %g (figures uncompressed)\n",
           ctx.label, ctx.workload, ctx.scale);

    for (k = 0; cols[k]; k += 2) {
        printf(" %8s%s", cols[k + 1], cols[k + 2] ? "" : "\n");
    }

    json_array_foreach(stages, i, st) {
        for (k = 0; cols[k]; k += 2) {
            printf(" %8.4g%s", json_number_value(json_object_get(st, cols[k])),
                   cols[k + 2] ? "" : "\n");
        }
    }

    fflush(stdout);
}


static int
kvl_write_csv(const char *path, json_t *stages)
{
    int          row;
    FILE        *f;
    size_t       i, n, m;
    json_t      *st, *v, *c;
    const char  *key, *k;

    /* one row per stage, the columns of the JSON; backends as "a=1;b=2" */

    f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    json_array_foreach(stages, i, st) {
        for (row = i ? 1 : 0; row < 2; row++) {    /* 0: the header */
            n = 0;

            json_object_foreach(st, key, v) {
                fputs(n++ ? "," : "", f);

                if (row == 0) {
                    fputs(key, f);
                } else if (json_is_string(v)) {
                    fputs(json_string_value(v), f);
                } else if (json_is_integer(v)) {
                    fprintf(f, "%lld", (long long) json_integer_value(v));
                } else if (json_is_real(v)) {
                    fprintf(f, "%.6g", json_real_value(v));
                } else {
                    m = 0;

                    json_object_foreach(v, k, c) {
                        fprintf(f, "%s%s=%lld", m++ ? ";" : "", k,
                                (long long) json_integer_value(c));
                    }
                }
            }

            fputc('\n', f);
        }
    }

    if (fclose(f) != 0) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    return 0;
}
