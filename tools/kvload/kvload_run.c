/*
 * kvload: the run.  Poisson arrivals on each stage of the ladder, a
 * request issued for each unless the in-flight cap drops it, the SSE
 * chunks timed as they come, the servers' queues scraped on a tick.
 * Times here are real; the report scales them.
 */

#define _GNU_SOURCE                     /* memmem() */

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "kvload.h"


#define KVL_TICK_US       20000
#define KVL_MAX_ERRLOG    10


typedef struct {
    kvl_http_req_t      http;
    kvl_ctx_t          *ctx;
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


static double kvl_arrival_gap(kvl_ctx_t *ctx, kvl_stage_t *st);
static void kvl_stage_begin(kvl_ctx_t *ctx, double now);
static void kvl_arrive(evutil_socket_t fd, short what, void *arg);
static void kvl_issue(kvl_ctx_t *ctx, kvl_stage_t *st, double t);
static void kvl_on_event(kvl_http_req_t *hr, const char *d, size_t len,
    double now);
static const char *kvl_json_value(const char *d, size_t len, const char *key);
static void kvl_on_done(kvl_http_req_t *hr);
static void kvl_tick(evutil_socket_t fd, short what, void *arg);
static void kvl_scrape_done(kvl_http_req_t *hr);
static void kvl_on_signal(evutil_socket_t fd, short what, void *arg);


int
kvl_run_init(kvl_ctx_t *ctx)
{
    unsigned        i;
    struct timeval  tv = { 0, KVL_TICK_US };

    ctx->arrival = evtimer_new(ctx->base, kvl_arrive, ctx);
    ctx->tick = event_new(ctx->base, -1, EV_PERSIST, kvl_tick, ctx);
    ctx->sigint = evsignal_new(ctx->base, SIGINT, kvl_on_signal, ctx);

    if (ctx->arrival == NULL || ctx->tick == NULL || ctx->sigint == NULL
        || event_add(ctx->tick, &tv) != 0
        || event_add(ctx->sigint, NULL) != 0)
    {
        return -1;
    }

    for (i = 0; i < ctx->nmetrics; i++) {
        ctx->mreqs[i].done = kvl_scrape_done;
        ctx->mreqs[i].data = ctx;
    }

    ctx->rng = ctx->wl.seed ^ 0x6172726976616c73ULL;

    return 0;
}


int
kvl_run(kvl_ctx_t *ctx)
{
    kvl_stage_begin(ctx, kvl_now());

    return event_base_dispatch(ctx->base);
}


/* the gaps of Poisson arrivals are exponential */

static double
kvl_arrival_gap(kvl_ctx_t *ctx, kvl_stage_t *st)
{
    if (ctx->trace) {
        return kvl_trace_gap(ctx->trace) / ctx->scale;
    }

    /* 1 - u is in (0, 1]: the log stays finite */
    return -log(1.0 - kva_rand_unit(&ctx->rng)) / (st->qps * ctx->scale);
}


static void
kvl_stage_begin(kvl_ctx_t *ctx, double now)
{
    kvl_stage_t     *st = &ctx->stages[ctx->cur];
    struct timeval   tv = { 0, 0 };

    st->t_start = now;
    ctx->t_stage_end = now + (st->seconds > 0.0 ? st->seconds
                                                 : ctx->stage_seconds)
                             / ctx->scale;
    ctx->next_arrival = now + kvl_arrival_gap(ctx, st);
    ctx->arriving = 1;

    evtimer_add(ctx->arrival, &tv);
}


static void
kvl_arrive(evutil_socket_t fd, short what, void *arg)
{
    double           now, next;
    kvl_ctx_t       *ctx = arg;
    kvl_stage_t     *st = &ctx->stages[ctx->cur];
    struct timeval   tv;

    now = kvl_now();

    while (!ctx->stopping && ctx->next_arrival <= now
           && ctx->next_arrival <= ctx->t_stage_end
           && (ctx->stage_requests == 0
               || st->sent + st->dropped < ctx->stage_requests))
    {
        kvl_issue(ctx, st, ctx->next_arrival);
        ctx->next_arrival += kvl_arrival_gap(ctx, st);
    }

    next = ctx->next_arrival < ctx->t_stage_end ? ctx->next_arrival
                                                : ctx->t_stage_end;

    if (ctx->stopping || now >= ctx->t_stage_end
        || (ctx->stage_requests
            && st->sent + st->dropped >= ctx->stage_requests))
    {
        st->t_arrivals_end = now < ctx->t_stage_end ? now : ctx->t_stage_end;
        ctx->arriving = 0;
        return;
    }

    tv.tv_sec = (time_t) (next - now);
    tv.tv_usec = (suseconds_t) ((next - now - (double) tv.tv_sec) * 1e6);

    evtimer_add(ctx->arrival, &tv);
}


static void
kvl_issue(kvl_ctx_t *ctx, kvl_stage_t *st, double t)
{
    int             rc;
    size_t          len;
    const char     *body;
    kvl_request_t  *rq;

    /* the workload advances even for a drop: same prompts for everyone */

    rc = ctx->trace ? kvl_trace_next(ctx->trace, ctx->wl.model,
                                     ctx->wl.prompt_ids, &body, &len)
                    : kvl_workload_next(ctx->work, &body, &len);

    if (ctx->inflight >= ctx->max_inflight) {
        st->dropped++;
        return;
    }

    st->sent++;

    rq = rc == 0 ? calloc(1, sizeof(kvl_request_t)) : NULL;
    if (rq == NULL) {
        st->errors++;
        return;
    }

    rq->ctx = ctx;
    rq->stage = st;
    rq->t_arrival = t;
    rq->http.target = &ctx->server;
    rq->http.on_event = kvl_on_event;
    rq->http.done = kvl_on_done;
    rq->http.data = rq;

    if (kvl_http_send(&rq->http, ctx->wl.prompt_ids ? "/v1/completions"
                                                    : "/v1/chat/completions",
                      body, len,
                      ctx->timeout / ctx->scale)
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
    ctx->inflight++;
}


static void
kvl_on_event(kvl_http_req_t *hr, const char *d, size_t len, double now)
{
    const char     *v, *server;
    json_t         *root;
    kvl_ctx_t      *ctx;
    json_int_t      pt = 0, ct = 0, cached = 0;
    kvl_request_t  *rq = hr->data;

    ctx = rq->ctx;
    v = kvl_json_value(d, len, "\"content\"");

    if (v == NULL) {
        /* a text completion's chunk */
        v = kvl_json_value(d, len, "\"text\"");
    }

    if (v != NULL && v[0] == '"' && v[1] != '"') {
        if (rq->chunks++ == 0) {
            rq->t_first = now;

        } else if (kvl_samples_add(&rq->stage->gap, now - rq->t_last) != 0) {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }

        rq->t_last = now;
        ctx->stages[ctx->cur].window_tokens += ctx->arriving;
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
    kvl_ctx_t      *ctx;
    kvl_stage_t    *st;
    kvl_request_t  *rq = hr->data;

    ctx = rq->ctx;
    st = rq->stage;
    st->inflight--;
    ctx->inflight--;

    tokens = rq->completion_tokens ? rq->completion_tokens : rq->chunks;

    if (hr->error != 0 || hr->status != 200 || rq->failed
        || rq->chunks == 0)
    {
        st->errors++;
        st->timeouts += (hr->error == KVL_HTTP_ETIMEOUT);
        st->http_5xx += (hr->status >= 500);
        st->cut += (hr->status == 200);

        if (ctx->errlog++ < KVL_MAX_ERRLOG) {
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
    kvl_ctx_t    *ctx = arg;
    kvl_stage_t  *st = &ctx->stages[ctx->cur];

    now = kvl_now();

    if (!ctx->arriving) {
        if (ctx->cur + 1 < ctx->nstages && !ctx->stopping) {
            if (st->inflight == 0 || (now - st->t_arrivals_end) * ctx->scale
                                     >= ctx->drain_seconds)
            {
                ctx->cur++;
                kvl_stage_begin(ctx, now);
            }

        } else if (ctx->inflight == 0 && ctx->mpending == 0) {
            event_base_loopexit(ctx->base, NULL);
            return;
        }
    }

    if (ctx->nmetrics == 0 || ctx->mpending
        || (!ctx->arriving && !ctx->inflight)
        || now - ctx->mlast < ctx->metrics_ms / 1000.0)
    {
        return;
    }

    ctx->mlast = now;
    ctx->mok = 0;
    ctx->mwaiting = 0.0;

    for (i = 0; i < ctx->nmetrics; i++) {
        if (kvl_http_send(&ctx->mreqs[i], "/metrics", NULL, 0, 2.0) == 0) {
            ctx->mpending++;
        }
    }
}


static void
kvl_scrape_done(kvl_http_req_t *hr)
{
    char          *line, *v;
    size_t         n;
    kvl_ctx_t     *ctx = hr->data;
    kvl_stage_t   *st = &ctx->stages[ctx->cur];

    while ((line = evbuffer_readln(hr->buf, &n, EVBUFFER_EOL_ANY)) != NULL) {
        v = strrchr(line, ' ');

        if (v && strncmp(line, "vllm:num_requests_waiting", 25) == 0) {
            ctx->mwaiting += atof(v + 1);
        }

        free(line);
    }

    ctx->mok += (hr->error == 0 && hr->status == 200);

    if (--ctx->mpending == 0 && ctx->mok) {
        /* per-server means, like llm-d's "mean wait queue" */
        st->waiting_sum += ctx->mwaiting / ctx->mok;
        st->scrapes++;
    }
}


static void
kvl_on_signal(evutil_socket_t fd, short what, void *arg)
{
    kvl_ctx_t  *ctx = arg;

    if (ctx->stopping) {
        event_base_loopbreak(ctx->base);
        return;
    }

    fprintf(stderr, "kvload: stopping; interrupt again to quit now\n");

    ctx->stopping = 1;
}
