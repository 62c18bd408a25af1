/*
 * kvload: open-loop load generator for OpenAI-compatible LLM servers.
 *
 * Poisson arrivals on a ladder of QPS stages; every request streams (SSE)
 * and is timed to its first content chunk (TTFT), its last one, and its
 * end.  Requests over the in-flight cap are dropped and counted, never
 * queued, so a slow server cannot slow the arrivals down.
 *
 * Time compression: with --time-scale S the simulated servers run S times
 * faster than real GPUs, so kvload sends at S * QPS per real second and
 * multiplies every measured duration by S when it reports.  Reported
 * seconds, QPS and tokens/s therefore read as uncompressed (real GPU)
 * figures; --stage-seconds, --timeout and --drain-seconds are given in
 * uncompressed seconds too.  Client and proxy overhead is scaled as well:
 * 1 ms of real overhead reads as S ms.
 */

#define _GNU_SOURCE                    /* memmem(), strcasestr() */

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
    kvl_http_req_t   http;
    kvl_stage_t     *stage;
    double           t_arrival;
    double           t_first;
    double           t_last;
    uint64_t         chunks;
    uint64_t         completion_tokens;
    uint64_t         prompt_tokens;
    uint64_t         cached_tokens;
    unsigned         usage:1;
    unsigned         failed:1;
    char             backend[KVL_BACKEND_LEN];
} kvl_request_t;


typedef struct {
    const char      *target;
    const char      *workload;
    const char      *metrics;
    const char      *json;
    const char      *csv;
    const char      *label;
    double           scale;
    double           stage_seconds;
    double           timeout;
    double           drain_seconds;
    uint64_t         stage_requests;
    uint64_t         max_inflight;
    unsigned         metrics_ms;
    kvl_wl_conf_t    wl;
} kvl_opts_t;


typedef struct {
    kvl_opts_t        o;
    struct event_base *base;
    kvl_target_t      target;
    kvl_target_t      mtargets[KVL_MAX_METRICS];
    kvl_http_req_t    mreqs[KVL_MAX_METRICS];
    unsigned          nmetrics;
    unsigned          mpending;
    unsigned          mok;
    double            mwaiting;
    double            mrunning;
    double            mlast;
    kvl_workload_t   *wl;
    kvl_stage_t       stages[KVL_MAX_STAGES];
    unsigned          nstages;
    unsigned          cur;
    int               arriving;
    int               stopping;
    unsigned          errlog;
    uint64_t          rng;
    uint64_t          inflight;
    double            next_arrival;
    double            t_stage_end;
    struct event     *arrival;
    struct event     *tick;
    struct event     *sigint;
} kvl_ctx_t;


static kvl_ctx_t  ctx;


static int kvl_options(int argc, char **argv);
static int kvl_ladder(const char *s);
static int kvl_metrics_targets(const char *s);
static void kvl_usage(void);
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
static void kvl_report(void);
static int kvl_write_json(const char *path);
static int kvl_write_csv(const char *path);


int
main(int argc, char **argv)
{
    int             rc;
    unsigned        i;
    struct rlimit   rl;
    struct timeval  tv;

    if (kvl_options(argc, argv) != 0) {
        return 2;
    }

    /* every in-flight request holds a socket */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void) setrlimit(RLIMIT_NOFILE, &rl);
    }

    signal(SIGPIPE, SIG_IGN);

    ctx.wl = kvl_workload_create(&ctx.o.wl);
    ctx.base = event_base_new();

    if (ctx.wl == NULL || ctx.base == NULL) {
        fprintf(stderr, "kvload: out of memory\n");
        return 1;
    }

    if (kvl_target_init(&ctx.target, ctx.base, ctx.o.target) != 0) {
        fprintf(stderr, "kvload: bad --target \"%s\"\n", ctx.o.target);
        return 2;
    }

    if (ctx.o.metrics && kvl_metrics_targets(ctx.o.metrics) != 0) {
        fprintf(stderr, "kvload: bad --metrics \"%s\"\n", ctx.o.metrics);
        return 2;
    }

    ctx.arrival = evtimer_new(ctx.base, kvl_arrive, NULL);
    ctx.tick = event_new(ctx.base, -1, EV_PERSIST, kvl_tick, NULL);
    ctx.sigint = evsignal_new(ctx.base, SIGINT, kvl_on_signal, NULL);

    tv.tv_sec = 0;
    tv.tv_usec = KVL_TICK_US;

    if (ctx.arrival == NULL || ctx.tick == NULL || ctx.sigint == NULL
        || event_add(ctx.tick, &tv) != 0 || event_add(ctx.sigint, NULL) != 0)
    {
        fprintf(stderr, "kvload: cannot set up events\n");
        return 1;
    }

    ctx.rng = ctx.o.wl.seed ^ 0x6172726976616c73ULL;

    kvl_stage_begin(kvl_now());

    rc = event_base_dispatch(ctx.base);

    kvl_report();

    if ((ctx.o.json && kvl_write_json(ctx.o.json) != 0)
        || (ctx.o.csv && kvl_write_csv(ctx.o.csv) != 0))
    {
        rc = 1;
    }

    if (ctx.inflight == 0) {
        for (i = 0; i < ctx.nmetrics; i++) {
            kvl_target_close(&ctx.mtargets[i]);
            if (ctx.mreqs[i].body) {
                evbuffer_free(ctx.mreqs[i].body);
            }
        }

        kvl_target_close(&ctx.target);
        event_free(ctx.arrival);
        event_free(ctx.tick);
        event_free(ctx.sigint);
        event_base_free(ctx.base);
    }

    for (i = 0; i < ctx.nstages; i++) {
        kvl_stage_free(&ctx.stages[i]);
    }

    kvl_workload_free(ctx.wl);

    return rc == 0 ? 0 : 1;
}


static int
kvl_options(int argc, char **argv)
{
    int                  c;
    const char          *p;
    kvl_opts_t          *o = &ctx.o;
    static const char   *ladder = "3,10,20,40,60";
    static struct option opts[] = {
        { "target", 1, NULL, 'T' }, { "workload", 1, NULL, 'w' },
        { "qps-ladder", 1, NULL, 'q' }, { "stage-requests", 1, NULL, 'n' },
        { "stage-seconds", 1, NULL, 't' }, { "time-scale", 1, NULL, 'S' },
        { "groups", 1, NULL, 'g' }, { "prompts-per-group", 1, NULL, 'p' },
        { "turns", 1, NULL, 'u' }, { "system-tokens", 1, NULL, 's' },
        { "question-tokens", 1, NULL, 'Q' }, { "output-tokens", 1, NULL, 'o' },
        { "model", 1, NULL, 'm' }, { "seed", 1, NULL, 'r' },
        { "max-inflight", 1, NULL, 'i' }, { "timeout", 1, NULL, 'x' },
        { "drain-seconds", 1, NULL, 'd' }, { "metrics", 1, NULL, 'M' },
        { "metrics-interval-ms", 1, NULL, 'I' }, { "json", 1, NULL, 'j' },
        { "csv", 1, NULL, 'c' }, { "label", 1, NULL, 'l' },
        { "help", 0, NULL, 'h' }, { NULL, 0, NULL, 0 }
    };

    o->target = "127.0.0.1:8080";
    o->workload = "shared-prefix";
    o->label = "";
    o->scale = 1.0;
    o->stage_seconds = 60.0;
    o->timeout = 600.0;
    o->max_inflight = 2048;
    o->metrics_ms = 250;
    o->wl.groups = 150;
    o->wl.prompts_per_group = 5;
    o->wl.turns = 5;
    o->wl.system_tokens = 6000;
    o->wl.question_tokens = 1200;
    o->wl.output_tokens = 1000;
    o->wl.model = "kvsim";
    o->wl.seed = 1;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'T': o->target = optarg; break;
        case 'w': o->workload = optarg; break;
        case 'q': ladder = optarg; break;
        case 'n': o->stage_requests = strtoull(optarg, NULL, 10); break;
        case 't': o->stage_seconds = atof(optarg); break;
        case 'S': o->scale = atof(optarg); break;
        case 'g': o->wl.groups = (unsigned) atoi(optarg); break;
        case 'p': o->wl.prompts_per_group = (unsigned) atoi(optarg); break;
        case 'u': o->wl.turns = (unsigned) atoi(optarg); break;
        case 's': o->wl.system_tokens = (unsigned) atoi(optarg); break;
        case 'Q': o->wl.question_tokens = (unsigned) atoi(optarg); break;
        case 'o': o->wl.output_tokens = (unsigned) atoi(optarg); break;
        case 'm': o->wl.model = optarg; break;
        case 'r': o->wl.seed = strtoull(optarg, NULL, 10); break;
        case 'i': o->max_inflight = strtoull(optarg, NULL, 10); break;
        case 'x': o->timeout = atof(optarg); break;
        case 'd': o->drain_seconds = atof(optarg); break;
        case 'M': o->metrics = optarg; break;
        case 'I': o->metrics_ms = (unsigned) atoi(optarg); break;
        case 'j': o->json = optarg; break;
        case 'c': o->csv = optarg; break;
        case 'l': o->label = optarg; break;
        default: kvl_usage(); return -1;
        }
    }

    if (strcmp(o->workload, "shared-prefix") == 0) {
        o->wl.kind = KVL_WL_SHARED_PREFIX;
    } else if (strcmp(o->workload, "multi-turn") == 0) {
        o->wl.kind = KVL_WL_MULTI_TURN;
    } else if (strcmp(o->workload, "no-sharing") == 0) {
        o->wl.kind = KVL_WL_NO_SHARING;
    } else {
        fprintf(stderr, "kvload: unknown --workload \"%s\"\n", o->workload);
        return -1;
    }

    for (p = o->wl.model; *p; p++) {
        if (*p == '"' || *p == '\\' || (unsigned char) *p < 0x20) {
            fprintf(stderr, "kvload: --model must need no JSON escaping\n");
            return -1;
        }
    }

    if (optind != argc || o->scale <= 0.0 || o->stage_seconds <= 0.0
        || o->timeout <= 0.0 || o->max_inflight == 0 || o->metrics_ms == 0
        || o->wl.groups == 0 || o->wl.prompts_per_group == 0
        || o->wl.turns == 0 || o->wl.output_tokens == 0
        || o->wl.system_tokens + o->wl.question_tokens == 0
        || strlen(o->wl.model) > 128 || kvl_ladder(ladder) != 0)
    {
        kvl_usage();
        return -1;
    }

    return 0;
}


static int
kvl_ladder(const char *s)
{
    char    *end;
    double   qps;

    while (*s) {
        qps = strtod(s, &end);

        if (end == s || qps <= 0.0 || ctx.nstages == KVL_MAX_STAGES) {
            return -1;
        }

        ctx.stages[ctx.nstages++].qps = qps;
        s = (*end == ',') ? end + 1 : end;

        if (*end != ',' && *end != '\0') {
            return -1;
        }
    }

    return ctx.nstages ? 0 : -1;
}


static int
kvl_metrics_targets(const char *s)
{
    char        host[80];
    const char *dash;
    long        first, last, port;

    /* host:port or host:first-last */

    dash = strrchr(s, '-');
    if (strlen(s) >= sizeof(host) || strchr(s, ':') == NULL) {
        return -1;
    }

    first = strtol(strrchr(s, ':') + 1, NULL, 10);
    last = dash ? strtol(dash + 1, NULL, 10) : first;

    if (last < first || last - first >= KVL_MAX_METRICS) {
        return -1;
    }

    for (port = first; port <= last; port++) {
        snprintf(host, sizeof(host), "%.*s:%ld",
                 (int) (strrchr(s, ':') - s), s, port);

        if (kvl_target_init(&ctx.mtargets[ctx.nmetrics], ctx.base, host)
            != 0)
        {
            return -1;
        }

        ctx.mreqs[ctx.nmetrics].target = &ctx.mtargets[ctx.nmetrics];
        ctx.mreqs[ctx.nmetrics].done = kvl_scrape_done;
        ctx.nmetrics++;
    }

    return 0;
}


static void
kvl_usage(void)
{
    fprintf(stderr,
        "usage: kvload [options]\n"
        "  --target HOST:PORT          127.0.0.1:8080\n"
        "  --workload KIND             shared-prefix | multi-turn | "
        "no-sharing\n"
        "  --qps-ladder Q1,Q2,...      3,10,20,40,60 (uncompressed QPS)\n"
        "  --stage-requests N          cap per stage (0: none)\n"
        "  --stage-seconds T           cap per stage, uncompressed (60)\n"
        "  --time-scale S              servers run S x faster than real\n"
        "  --groups G --prompts-per-group P --turns K\n"
        "  --system-tokens N --question-tokens N --output-tokens N\n"
        "  --model NAME --seed N --max-inflight N (2048)\n"
        "  --timeout T (600) --drain-seconds T (0: stages back to back)\n"
        "  --metrics HOST:PORT[-PORT] --metrics-interval-ms MS (250)\n"
        "  --json FILE --csv FILE --label TEXT\n"
        "Durations in and out are uncompressed: measured x S.\n");
}


static void
kvl_stage_begin(double now)
{
    kvl_stage_t     *st = &ctx.stages[ctx.cur];
    struct timeval   tv = { 0, 0 };

    st->t_start = now;
    ctx.t_stage_end = now + ctx.o.stage_seconds / ctx.o.scale;
    ctx.next_arrival = now - log(kvl_rand_unit(&ctx.rng))
                             / (st->qps * ctx.o.scale);
    ctx.arriving = 1;

    evtimer_add(ctx.arrival, &tv);
}


static void
kvl_arrive(evutil_socket_t fd, short what, void *arg)
{
    double           now, wait;
    kvl_stage_t     *st = &ctx.stages[ctx.cur];
    struct timeval   tv;

    now = kvl_now();

    for ( ;; ) {
        if (ctx.stopping || (ctx.o.stage_requests
                             && st->sent + st->dropped
                                >= ctx.o.stage_requests))
        {
            st->t_arrivals_end = now;
            ctx.arriving = 0;
            return;
        }

        if (ctx.next_arrival > ctx.t_stage_end) {
            if (now >= ctx.t_stage_end) {
                st->t_arrivals_end = ctx.t_stage_end;
                ctx.arriving = 0;
                return;
            }

            wait = ctx.t_stage_end - now;
            break;
        }

        if (ctx.next_arrival > now) {
            wait = ctx.next_arrival - now;
            break;
        }

        kvl_issue(st, ctx.next_arrival);

        ctx.next_arrival -= log(kvl_rand_unit(&ctx.rng))
                            / (st->qps * ctx.o.scale);
    }

    tv.tv_sec = (time_t) wait;
    tv.tv_usec = (suseconds_t) ((wait - (double) tv.tv_sec) * 1e6);

    evtimer_add(ctx.arrival, &tv);
}


static void
kvl_issue(kvl_stage_t *st, double t)
{
    size_t          len;
    const char     *body;
    kvl_request_t  *rq;

    /* the workload advances even for a drop: same prompts for everyone */

    if (kvl_workload_next(ctx.wl, &body, &len) != 0) {
        st->sent++;
        st->errors++;
        return;
    }

    if (ctx.inflight >= ctx.o.max_inflight) {
        st->dropped++;
        return;
    }

    st->sent++;

    rq = calloc(1, sizeof(kvl_request_t));
    if (rq == NULL) {
        st->errors++;
        return;
    }

    rq->stage = st;
    rq->t_arrival = t;
    rq->http.target = &ctx.target;
    rq->http.on_event = kvl_on_event;
    rq->http.done = kvl_on_done;
    rq->http.data = rq;

    if (kvl_http_send(&rq->http, "POST", "/v1/chat/completions", body, len,
                      ctx.o.timeout / ctx.o.scale)
        != 0)
    {
        st->errors++;
        free(rq);
        return;
    }

    st->inflight++;
    ctx.inflight++;
}


static void
kvl_on_event(kvl_http_req_t *hr, const char *d, size_t len, double now)
{
    const char     *v;
    json_t         *root, *o, *n;
    kvl_request_t  *rq = hr->data;

    if (len == 6 && memcmp(d, "[DONE]", 6) == 0) {
        return;
    }

    v = kvl_json_value(d, len, "\"content\"");

    if (v != NULL && v[0] == '"' && v[1] != '"') {
        if (rq->chunks++ == 0) {
            rq->t_first = now;
        }

        rq->t_last = now;
    }

    /* the rare chunks worth a real JSON parse */

    v = kvl_json_value(d, len, "\"usage\"");

    if ((v == NULL || *v != '{')
        && (rq->backend[0] || memmem(d, len, "\"kvsim\"", 7) == NULL)
        && (v = kvl_json_value(d, len, "\"error\"")) == NULL)
    {
        return;
    }

    root = json_loadb(d, len, 0, NULL);
    if (root == NULL) {
        rq->failed = 1;
        return;
    }

    if (json_is_object(json_object_get(root, "error"))) {
        rq->failed = 1;
    }

    o = json_object_get(json_object_get(root, "kvsim"), "server");

    if (json_is_string(o)) {
        snprintf(rq->backend, sizeof(rq->backend), "%s", json_string_value(o));

    } else if (json_is_integer(o)) {
        snprintf(rq->backend, sizeof(rq->backend), "%lld",
                 (long long) json_integer_value(o));
    }

    o = json_object_get(root, "usage");

    if (json_is_object(o)) {
        rq->usage = 1;
        n = json_object_get(o, "prompt_tokens");
        rq->prompt_tokens = json_is_integer(n) ? json_integer_value(n) : 0;
        n = json_object_get(o, "completion_tokens");
        rq->completion_tokens = json_is_integer(n) ? json_integer_value(n)
                                                   : 0;
        n = json_object_get(json_object_get(o, "prompt_tokens_details"),
                            "cached_tokens");
        rq->cached_tokens = json_is_integer(n) ? json_integer_value(n) : 0;
    }

    json_decref(root);
}


static const char *
kvl_json_value(const char *d, size_t len, const char *key)
{
    const char  *p, *end = d + len;
    size_t       klen = strlen(key);

    /* the value after "key": without parsing; prompts hold no quotes */

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
    double          itl;
    uint64_t        tokens;
    kvl_stage_t    *st;
    kvl_request_t  *rq = hr->data;

    st = rq->stage;
    st->inflight--;
    ctx.inflight--;

    if (hr->t_done > st->t_last_done) {
        st->t_last_done = hr->t_done;
    }

    if (hr->error != KVL_HTTP_OK || hr->status != 200 || rq->failed
        || rq->chunks == 0)
    {
        st->errors++;
        st->timeouts += (hr->error == KVL_HTTP_ETIMEOUT);

        if (ctx.errlog++ < KVL_MAX_ERRLOG) {
            fprintf(stderr, "kvload: request failed: %s, status %d%s\n",
                    kvl_http_strerror(hr->error), hr->status,
                    rq->failed ? ", error in stream" : "");
        }

        free(rq);
        return;
    }

    tokens = rq->usage && rq->completion_tokens ? rq->completion_tokens
                                                : rq->chunks;

    if (kvl_samples_add(&st->ttft, rq->t_first - rq->t_arrival) != 0
        || kvl_samples_add(&st->e2e, hr->t_done - rq->t_arrival) != 0)
    {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);
    }

    if (tokens > 1 && rq->t_last > rq->t_first) {
        itl = (rq->t_last - rq->t_first) / (double) (tokens - 1);

        if (kvl_samples_add(&st->itl, itl) != 0) {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }
    }

    st->completed++;
    st->output_tokens += tokens;
    st->prompt_tokens += rq->prompt_tokens;
    st->cached_tokens += rq->cached_tokens;

    kvl_stage_backend(st, rq->backend[0] ? rq->backend : hr->upstream);

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
        if (ctx.cur + 1 < ctx.nstages && !ctx.stopping
            && (st->inflight == 0
                || (now - st->t_arrivals_end) * ctx.o.scale
                   >= ctx.o.drain_seconds))
        {
            ctx.cur++;
            kvl_stage_begin(now);

        } else if (ctx.cur + 1 == ctx.nstages || ctx.stopping) {
            if (ctx.inflight == 0 && ctx.mpending == 0) {
                event_base_loopexit(ctx.base, NULL);
                return;
            }
        }
    }

    if (ctx.nmetrics == 0 || ctx.mpending
        || now - ctx.mlast < ctx.o.metrics_ms / 1000.0
        || (!ctx.arriving && ctx.inflight == 0))
    {
        return;
    }

    ctx.mlast = now;
    ctx.mok = 0;
    ctx.mwaiting = 0.0;
    ctx.mrunning = 0.0;

    for (i = 0; i < ctx.nmetrics; i++) {
        if (kvl_http_send(&ctx.mreqs[i], "GET", "/metrics", NULL, 0, 2.0)
            == 0)
        {
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

    if (hr->error == KVL_HTTP_OK && hr->status == 200) {
        ctx.mok++;

        while ((line = evbuffer_readln(hr->body, &n, EVBUFFER_EOL_ANY))
               != NULL)
        {
            v = strrchr(line, ' ');

            if (v && strncmp(line, "vllm:num_requests_waiting", 25) == 0) {
                ctx.mwaiting += atof(v + 1);

            } else if (v
                       && strncmp(line, "vllm:num_requests_running", 25)
                          == 0)
            {
                ctx.mrunning += atof(v + 1);
            }

            free(line);
        }
    }

    evbuffer_drain(hr->body, evbuffer_get_length(hr->body));

    if (--ctx.mpending == 0 && ctx.mok) {
        /* per-server means, like llm-d's "mean wait queue" */
        st->waiting_sum += ctx.mwaiting / ctx.mok;
        st->running_sum += ctx.mrunning / ctx.mok;
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

    fprintf(stderr, "kvload: stopping, waiting for %llu in flight "
            "(interrupt again to quit now)\n",
            (unsigned long long) ctx.inflight);

    ctx.stopping = 1;
}


static void
kvl_report(void)
{
    unsigned        i;
    kvl_stage_t    *st;
    kvl_summary_t   s;

    printf("# kvload %s %s, time scale %g (figures uncompressed)\n",
           ctx.o.label, ctx.o.workload, ctx.o.scale);
    printf("%5s %6s %6s %5s %5s %6s %8s %8s %8s %7s %8s %8s %6s %6s\n",
           "qps", "sent", "ok", "err", "drop", "ach", "ttft50", "ttft90",
           "ttft99", "itl50", "e2e50", "tok/s", "hit%", "waitq");

    for (i = 0; i <= ctx.cur && i < ctx.nstages; i++) {
        st = &ctx.stages[i];
        kvl_stage_summarize(st, ctx.o.scale, &s);

        printf("%5g %6llu %6llu %5llu %5llu %6.2f %8.3f %8.3f %8.3f %7.4f "
               "%8.2f %8.0f %6.1f %6.2f\n", st->qps,
               (unsigned long long) st->sent,
               (unsigned long long) st->completed,
               (unsigned long long) st->errors,
               (unsigned long long) st->dropped, s.achieved_qps,
               s.ttft_p50, s.ttft_p90, s.ttft_p99, s.itl_p50, s.e2e_p50,
               s.gen_tok_s, s.hit_rate * 100.0, s.waiting_mean);
    }

    fflush(stdout);
}


static int
kvl_write_json(const char *path)
{
    int             rc;
    unsigned        i;
    size_t          b;
    json_t         *root, *stages, *o, *be;
    kvl_stage_t    *st;
    kvl_summary_t   s;

    root = json_pack("{s:s, s:s, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I,"
                     " s:I, s:I, s:I, s:s, s:I, s:f, s:[]}",
                     "label", ctx.o.label, "workload", ctx.o.workload,
                     "target", ctx.o.target, "time_scale", ctx.o.scale,
                     "stage_seconds", ctx.o.stage_seconds,
                     "stage_requests", (json_int_t) ctx.o.stage_requests,
                     "groups", (json_int_t) ctx.o.wl.groups,
                     "prompts_per_group",
                     (json_int_t) ctx.o.wl.prompts_per_group,
                     "turns", (json_int_t) ctx.o.wl.turns,
                     "system_tokens", (json_int_t) ctx.o.wl.system_tokens,
                     "question_tokens",
                     (json_int_t) ctx.o.wl.question_tokens,
                     "output_tokens", (json_int_t) ctx.o.wl.output_tokens,
                     "seed", (json_int_t) ctx.o.wl.seed,
                     "model", ctx.o.wl.model,
                     "max_inflight", (json_int_t) ctx.o.max_inflight,
                     "drain_seconds", ctx.o.drain_seconds, "stages");
    if (root == NULL) {
        return -1;
    }

    stages = json_object_get(root, "stages");
    rc = 0;

    for (i = 0; i <= ctx.cur && i < ctx.nstages && rc == 0; i++) {
        st = &ctx.stages[i];
        kvl_stage_summarize(st, ctx.o.scale, &s);

        o = json_pack("{s:f, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f,"
                      " s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:I,"
                      " s:{}}",
                      "qps", st->qps, "sent", (json_int_t) st->sent,
                      "completed", (json_int_t) st->completed,
                      "errors", (json_int_t) st->errors,
                      "timeouts", (json_int_t) st->timeouts,
                      "dropped", (json_int_t) st->dropped,
                      "achieved_qps", s.achieved_qps,
                      "ttft_p50", s.ttft_p50, "ttft_p90", s.ttft_p90,
                      "ttft_p99", s.ttft_p99, "itl_p50", s.itl_p50,
                      "e2e_p50", s.e2e_p50, "gen_tok_s", s.gen_tok_s,
                      "output_tokens", (json_int_t) st->output_tokens,
                      "prompt_tokens", (json_int_t) st->prompt_tokens,
                      "cached_tokens", (json_int_t) st->cached_tokens,
                      "hit_rate", s.hit_rate,
                      "queue_waiting_mean", s.waiting_mean,
                      "queue_running_mean", s.running_mean,
                      "backend_unknown", (json_int_t) st->backend_unknown,
                      "backends");

        if (o == NULL || json_array_append_new(stages, o) != 0) {
            rc = -1;
            break;
        }

        be = json_object_get(o, "backends");

        for (b = 0; b < st->nbackends; b++) {
            if (json_object_set_new(be, st->backends[b].name,
                    json_integer((json_int_t) st->backends[b].requests))
                != 0)
            {
                rc = -1;
            }
        }
    }

    if (rc == 0) {
        rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    }

    json_decref(root);

    if (rc != 0) {
        fprintf(stderr, "kvload: cannot write %s\n", path);
    }

    return rc;
}


static int
kvl_write_csv(const char *path)
{
    FILE           *f;
    size_t          b;
    unsigned        i;
    kvl_stage_t    *st;
    kvl_summary_t   s;

    f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    fprintf(f, "label,workload,time_scale,qps,sent,completed,errors,"
            "timeouts,dropped,achieved_qps,ttft_p50,ttft_p90,ttft_p99,"
            "itl_p50,e2e_p50,gen_tok_s,prompt_tokens,cached_tokens,"
            "hit_rate,queue_waiting_mean,queue_running_mean,backends\n");

    for (i = 0; i <= ctx.cur && i < ctx.nstages; i++) {
        st = &ctx.stages[i];
        kvl_stage_summarize(st, ctx.o.scale, &s);

        fprintf(f, "%s,%s,%g,%g,%llu,%llu,%llu,%llu,%llu,%.4f,%.4f,%.4f,"
                "%.4f,%.5f,%.4f,%.1f,%llu,%llu,%.4f,%.3f,%.3f,",
                ctx.o.label, ctx.o.workload, ctx.o.scale, st->qps,
                (unsigned long long) st->sent,
                (unsigned long long) st->completed,
                (unsigned long long) st->errors,
                (unsigned long long) st->timeouts,
                (unsigned long long) st->dropped, s.achieved_qps,
                s.ttft_p50, s.ttft_p90, s.ttft_p99, s.itl_p50, s.e2e_p50,
                s.gen_tok_s, (unsigned long long) st->prompt_tokens,
                (unsigned long long) st->cached_tokens, s.hit_rate,
                s.waiting_mean, s.running_mean);

        for (b = 0; b < st->nbackends; b++) {
            fprintf(f, "%s%s=%llu", b ? ";" : "", st->backends[b].name,
                    (unsigned long long) st->backends[b].requests);
        }

        fputc('\n', f);
    }

    if (fclose(f) != 0) {
        fprintf(stderr, "kvload: %s: %s\n", path, strerror(errno));
        return -1;
    }

    return 0;
}
