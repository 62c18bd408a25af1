/*
 * kvload sessions workload: the run and its report.
 *
 * Sessions open at arrival times (Poisson at --sessions-rate, or at once)
 * while fewer than --sessions-live are open; each replays its requests in
 * order on its own clock: a request leaves at the session's start plus
 * its `t` (divided by the time scale), but not before its thread's
 * previous request has finished and the recorded think time has passed
 * since (a client cannot send the next turn before it has the answer);
 * those held back are counted.  A request that fails, or is dropped over
 * --max-inflight, is counted and the session goes on: its next prompt
 * does not depend on the answer.
 *
 * Every request carries the session's id in a header (--session-header,
 * x-session-affinity by default) for a router that binds sessions.  At
 * the end: the usual stage figures, the busiest server's requests over
 * the mean, and each session's share of its requests on the server that
 * served most of them.
 */

#define _GNU_SOURCE                     /* memmem() */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "kvload_sessions.h"


typedef struct {
    uint32_t           *cur;            /* the last prompt's ids */
    uint32_t            cap;
    unsigned            busy:1;
    unsigned            ran:1;
    double              t_done;         /* real */
} kvl_ss_thread_t;


typedef struct {
    kvl_ss_session_t   *s;
    struct event       *timer;
    kvl_ss_thread_t    *threads;
    double              t_start;        /* real */
    uint32_t            next;
    uint32_t            inflight;
    uint32_t            by[KVL_MAX_BACKENDS];
    uint64_t            done;
    uint64_t            context;        /* its last prompt's tokens */
    unsigned            open:1;
} kvl_ss_live_t;


typedef struct {
    kvl_http_req_t      http;
    kvl_ss_live_t      *ls;
    kvl_ss_req_t       *r;
    double              t_sent;
    double              t_first;
    double              t_last;
    uint64_t            chunks;
    uint64_t            prompt_tokens;
    uint64_t            cached_tokens;
    unsigned            failed:1;
    char                backend[KVL_BACKEND_LEN];
} kvl_ss_flight_t;


typedef struct {
    kvl_ctx_t          *ctx;
    kvl_ss_conf_t       conf;
    kvl_ss_set_t        set;
    kvl_ss_live_t      *live;
    size_t              next;           /* session to open next */
    size_t              open;
    size_t              closed;
    double              t0;
    double              next_arrival;   /* real */
    uint64_t            rng;
    struct event       *arrival;
    struct event       *watch;
    FILE               *log;
    char               *body;
    size_t              cap;
    size_t              len;
    uint64_t            held;           /* waited for the thread */
    uint64_t            sub_requests;
    uint64_t            context;        /* of the open sessions */
    double              context_area;   /* its integral, token-seconds */
    double              open_area;      /* sessions open, integral */
    double              t_area;
} kvl_ss_t;


static kvl_ss_t  kvl_ss;


static void kvl_ss_arrive(evutil_socket_t fd, short what, void *arg);
static int kvl_ss_open(kvl_ss_t *ss, kvl_ss_live_t *ls);
static void kvl_ss_close(kvl_ss_t *ss, kvl_ss_live_t *ls);
static void kvl_ss_fire(evutil_socket_t fd, short what, void *arg);
static void kvl_ss_pump(kvl_ss_live_t *ls);
static void kvl_ss_send(kvl_ss_t *ss, kvl_ss_live_t *ls, kvl_ss_req_t *r);
static void kvl_ss_event(kvl_http_req_t *hr, const char *d, size_t len,
    double now);
static void kvl_ss_done(kvl_http_req_t *hr);
static void kvl_ss_watch(evutil_socket_t fd, short what, void *arg);
static void kvl_ss_after(struct event *ev, double seconds);
static void kvl_ss_account(kvl_ss_t *ss);


int
kvl_ss_run(kvl_ctx_t *ctx, const kvl_ss_conf_t *conf)
{
    size_t          i;
    kvl_ss_t       *ss = &kvl_ss;
    struct timeval  tv = { 0, 100000 };

    ss->ctx = ctx;
    ss->conf = *conf;
    ss->rng = ctx->wl.seed ^ 0x73657373696f6e73ULL;

    if (kvl_ss_load(conf, &ss->set) != 0) {
        return -1;
    }

    fprintf(stderr, "kvload: %zu sessions (%llu read, %llu over "
            "--session-max-tokens, %llu broken)\n", ss->set.n,
            (unsigned long long) ss->set.read,
            (unsigned long long) ss->set.too_long,
            (unsigned long long) ss->set.broken);

    ss->live = calloc(ss->set.n, sizeof(kvl_ss_live_t));
    ss->arrival = evtimer_new(ctx->base, kvl_ss_arrive, ss);
    ss->watch = event_new(ctx->base, -1, EV_PERSIST, kvl_ss_watch, ss);

    if (ss->live == NULL || ss->arrival == NULL || ss->watch == NULL
        || event_add(ss->watch, &tv) != 0)
    {
        return -1;
    }

    for (i = 0; i < ss->set.n; i++) {
        ss->live[i].s = &ss->set.s[i];
    }

    if (conf->log) {
        ss->log = fopen(conf->log, "w");
        if (ss->log == NULL) {
            fprintf(stderr, "kvload: cannot write %s\n", conf->log);
            return -1;
        }
    }

    ctx->nstages = 1;
    ctx->stages[0].qps = 0.0;           /* the sessions' own clocks */
    ctx->cur = 0;
    ctx->arriving = 1;
    ss->t0 = kvl_now();
    ctx->stages[0].t_start = ss->t0;
    ss->next_arrival = ss->t0;

    kvl_ss_after(ss->arrival, 0.0);

    if (event_base_dispatch(ctx->base) < 0) {
        return -1;
    }

    if (ss->log && fclose(ss->log) != 0) {
        fprintf(stderr, "kvload: cannot write %s\n", conf->log);
        return -1;
    }

    ss->log = NULL;

    return 0;
}


static void
kvl_ss_after(struct event *ev, double seconds)
{
    struct timeval  tv;

    seconds = seconds > 0.0 ? seconds : 0.0;
    tv.tv_sec = (time_t) seconds;
    tv.tv_usec = (suseconds_t) ((seconds - (double) tv.tv_sec) * 1e6);

    evtimer_add(ev, &tv);
}


/* sessions open at their arrival times while fewer than `live` are */

static void
kvl_ss_arrive(evutil_socket_t fd, short what, void *arg)
{
    double       now;
    kvl_ss_t    *ss = arg;
    kvl_ctx_t   *ctx = ss->ctx;

    now = kvl_now();

    while (ss->next < ss->set.n && !ctx->stopping
           && (ss->conf.live == 0 || ss->open < ss->conf.live)
           && ss->next_arrival <= now)
    {
        if (kvl_ss_open(ss, &ss->live[ss->next++]) != 0) {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }

        if (ss->conf.rate > 0.0) {
            ss->next_arrival += -log(1.0 - kva_rand_unit(&ss->rng))
                                / (ss->conf.rate * ctx->scale);
        }
    }

    if (ss->next < ss->set.n && !ctx->stopping
        && (ss->conf.live == 0 || ss->open < ss->conf.live))
    {
        kvl_ss_after(ss->arrival, ss->next_arrival - now);
    }

    /* else a session that ends calls again */
}


static int
kvl_ss_open(kvl_ss_t *ss, kvl_ss_live_t *ls)
{
    ls->threads = calloc(ls->s->nthreads, sizeof(kvl_ss_thread_t));
    ls->timer = evtimer_new(ss->ctx->base, kvl_ss_fire, ls);

    if (ls->threads == NULL || ls->timer == NULL) {
        return -1;
    }

    kvl_ss_account(ss);
    ls->open = 1;
    ls->t_start = kvl_now();
    ss->open++;

    kvl_ss_pump(ls);

    return 0;
}


static void
kvl_ss_close(kvl_ss_t *ss, kvl_ss_live_t *ls)
{
    uint32_t    i;
    kvl_ctx_t  *ctx = ss->ctx;

    if (!ls->open) {
        return;
    }

    kvl_ss_account(ss);
    ls->open = 0;
    ss->open--;
    ss->closed++;
    ss->context -= ls->context;

    for (i = 0; i < ls->s->nthreads; i++) {
        free(ls->threads[i].cur);
    }

    free(ls->threads);
    ls->threads = NULL;
    event_free(ls->timer);
    ls->timer = NULL;

    if (ss->closed == ss->set.n
        || (ctx->stopping && ss->open == 0 && ctx->inflight == 0))
    {
        ctx->arriving = 0;
        ctx->stages[0].t_arrivals_end = kvl_now();
        event_base_loopexit(ctx->base, NULL);
        return;
    }

    kvl_ss_after(ss->arrival, ss->next_arrival - kvl_now());
}


static void
kvl_ss_fire(evutil_socket_t fd, short what, void *arg)
{
    kvl_ss_pump(arg);
}


/* the session's next requests that are due, in order */

static void
kvl_ss_pump(kvl_ss_live_t *ls)
{
    double            now, due, t_rec;
    kvl_ss_t         *ss = &kvl_ss;
    kvl_ctx_t        *ctx = ss->ctx;
    kvl_ss_req_t     *r;
    kvl_ss_thread_t  *th;

    while (ls->next < ls->s->nreqs && !ctx->stopping) {
        r = &ls->s->reqs[ls->next];
        th = &ls->threads[r->thread];

        if (th->busy) {
            return;                     /* kvl_ss_done() calls again */
        }

        t_rec = ls->t_start + r->t / ctx->scale;
        due = t_rec;

        if (th->ran && th->t_done + r->think / ctx->scale > due) {
            due = th->t_done + r->think / ctx->scale;
        }

        now = kvl_now();

        if (due > now) {
            kvl_ss_after(ls->timer, due - now);
            return;
        }

        /* held back by its thread by more than a millisecond, real */
        ss->held += (due > t_rec + 0.001);
        ls->next++;
        kvl_ss_send(ss, ls, r);
    }

    if (ls->inflight == 0 && (ls->next == ls->s->nreqs || ctx->stopping)) {
        kvl_ss_close(ss, ls);
    }
}


static void
kvl_ss_send(kvl_ss_t *ss, kvl_ss_live_t *ls, kvl_ss_req_t *r)
{
    void             *p;
    uint32_t          n, cap;
    kvl_ctx_t        *ctx = ss->ctx;
    kvl_stage_t      *st = &ctx->stages[0];
    kvl_ss_thread_t  *th = &ls->threads[r->thread];
    kvl_ss_flight_t  *fl;

    /* the thread's prompt: what it keeps, then its new ids */
    n = r->keep + r->nnew;

    if (n > th->cap) {
        for (cap = th->cap ? th->cap : 1024; cap < n; cap *= 2) {
            /* void */
        }

        p = realloc(th->cur, cap * sizeof(uint32_t));
        if (p == NULL) {
            goto nomem;
        }

        th->cur = p;
        th->cap = cap;
    }

    if (r->nnew) {
        memcpy(th->cur + r->keep, ls->s->ids + r->first,
               r->nnew * sizeof(uint32_t));
    }

    /*
     * over the in-flight cap, dropped and counted as in the other
     * workloads: each one in flight holds its body until it is written
     */
    if (ctx->inflight >= ctx->max_inflight) {
        st->dropped++;
        return;
    }

    st->sent++;
    ss->sub_requests += (r->thread != 0);

    /* a session's context: what its last prompt holds */
    kvl_ss_account(ss);
    ss->context += r->in;
    ss->context -= ls->context;
    ls->context = r->in;

    fl = calloc(1, sizeof(kvl_ss_flight_t));

    if (fl == NULL
        || kvl_ss_body(ls->s, r, th->cur, ctx->wl.model, &ss->body,
                       &ss->cap, &ss->len) != 0)
    {
        goto nomem;
    }

    fl->ls = ls;
    fl->r = r;
    fl->http.target = &ctx->server;
    fl->http.on_event = kvl_ss_event;
    fl->http.done = kvl_ss_done;
    fl->http.data = fl;

    if (ss->conf.header && ss->conf.header[0]) {
        fl->http.hname = ss->conf.header;
        fl->http.hvalue = ls->s->id;
    }

    fl->t_sent = kvl_now();

    if (ss->log) {
        fprintf(ss->log, "%s\t%u\t%.3f\n", ls->s->id, r->index,
                (fl->t_sent - ss->t0) * ctx->scale);
    }

    if (kvl_http_send(&fl->http, "/v1/chat/completions", ss->body, ss->len,
                      ctx->timeout / ctx->scale)
        != 0)
    {
        st->errors++;

        if (fl->http.buf) {
            evbuffer_free(fl->http.buf);
        }

        if (fl->http.again) {
            evbuffer_free(fl->http.again);
        }

        free(fl);
        return;
    }

    th->busy = 1;
    ls->inflight++;
    st->inflight++;
    ctx->inflight++;

    return;

nomem:

    fprintf(stderr, "kvload: out of memory\n");
    exit(1);
}


static void
kvl_ss_event(kvl_http_req_t *hr, const char *d, size_t len, double now)
{
    json_t           *root;
    const char       *server;
    json_int_t        pt = 0, cached = 0;
    kvl_ss_flight_t  *fl = hr->data;

    if (memmem(d, len, "\"content\":\"", 11) != NULL
        && memmem(d, len, "\"content\":\"\"", 12) == NULL)
    {
        if (fl->chunks++ == 0) {
            fl->t_first = now;

        } else if (kvl_samples_add(&kvl_ss.ctx->stages[0].gap,
                                   now - fl->t_last)
                   != 0)
        {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }

        fl->t_last = now;
        kvl_ss.ctx->stages[0].window_tokens++;
    }

    /* only the chunks worth a parse: the usage, the server, an error */

    if (memmem(d, len, "\"usage\":{", 9) == NULL
        && (fl->backend[0] || memmem(d, len, "\"kvsim\"", 7) == NULL)
        && memmem(d, len, "\"error\"", 7) == NULL)
    {
        return;
    }

    root = json_loadb(d, len, 0, NULL);

    if (root == NULL || json_is_object(json_object_get(root, "error"))) {
        fl->failed = 1;
    }

    if (json_unpack(root, "{s:{s:s}}", "kvsim", "server", &server) == 0) {
        snprintf(fl->backend, sizeof(fl->backend), "%s", server);
    }

    if (json_unpack(root, "{s:{s?I, s?{s?I}}}", "usage",
                    "prompt_tokens", &pt,
                    "prompt_tokens_details", "cached_tokens", &cached)
        == 0)
    {
        fl->prompt_tokens = pt;
        fl->cached_tokens = cached;
    }

    json_decref(root);
}


static void
kvl_ss_done(kvl_http_req_t *hr)
{
    size_t            b;
    const char       *server;
    kvl_ss_flight_t  *fl = hr->data;
    kvl_ss_live_t    *ls = fl->ls;
    kvl_ctx_t        *ctx = kvl_ss.ctx;
    kvl_stage_t      *st = &ctx->stages[0];
    kvl_ss_thread_t  *th = &ls->threads[fl->r->thread];

    st->inflight--;
    ctx->inflight--;
    ls->inflight--;
    st->retried += hr->retries;
    th->busy = 0;
    th->ran = 1;
    th->t_done = kvl_now();

    server = hr->server[0] ? hr->server
             : hr->upstream[0] ? hr->upstream : fl->backend;

    if (hr->error != 0 || hr->status != 200 || fl->failed
        || fl->chunks == 0)
    {
        st->errors++;
        st->timeouts += (hr->error == KVL_HTTP_ETIMEOUT);
        st->http_5xx += (hr->status >= 500);
        st->cut += (hr->status == 200);

        if (ctx->errlog++ < 10) {
            fprintf(stderr, "kvload: session %s request %u failed: %s, "
                    "HTTP %d%s\n", ls->s->id, fl->r->index,
                    kvl_http_strerror(hr->error), hr->status,
                    fl->failed ? ", error in stream" : "");
        }

    } else {
        if (kvl_samples_add(&st->ttft, fl->t_first - fl->t_sent) != 0
            || kvl_samples_add(&st->e2e, hr->t_done - fl->t_sent) != 0)
        {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }

        st->completed++;
        st->output_tokens += fl->chunks;
        st->prompt_tokens += fl->prompt_tokens;
        st->cached_tokens += fl->cached_tokens;
        kvl_stage_backend(st, server);
        ls->done++;

        for (b = 0; b < st->nbackends; b++) {
            if (strncmp(st->backends[b].name, server, KVL_BACKEND_LEN - 1)
                == 0)
            {
                ls->by[b]++;
                break;
            }
        }
    }

    evbuffer_free(hr->buf);

    if (hr->again) {
        evbuffer_free(hr->again);
    }

    free(fl);

    kvl_ss_pump(ls);
}


/* the integrals of the open sessions and of their contexts, to now */
static void
kvl_ss_account(kvl_ss_t *ss)
{
    double  now = kvl_now();

    if (ss->t_area > 0.0) {
        ss->context_area += (double) ss->context * (now - ss->t_area);
        ss->open_area += (double) ss->open * (now - ss->t_area);
    }

    ss->t_area = now;
}


/* an interrupt: nothing more is sent; the run ends when all are back */

static void
kvl_ss_watch(evutil_socket_t fd, short what, void *arg)
{
    size_t       i;
    kvl_ss_t    *ss = arg;
    kvl_ctx_t   *ctx = ss->ctx;

    if (!ctx->stopping || ctx->inflight) {
        return;
    }

    for (i = 0; i < ss->set.n; i++) {
        if (ss->live[i].open) {
            kvl_ss_close(ss, &ss->live[i]);
        }
    }

    ctx->arriving = 0;
    ctx->stages[0].t_arrivals_end = kvl_now();
    event_base_loopexit(ctx->base, NULL);
}


int
kvl_ss_report(kvl_ctx_t *ctx, json_t *root)
{
    size_t          i, b;
    json_t         *o;
    double          mean, busiest, share, share_sum, share_min;
    double          span, live_mean, context_mean;
    uint32_t        most;
    unsigned        servers;
    uint64_t        top, all, counted, total, reqs;
    kvl_ss_t       *ss = &kvl_ss;
    kvl_stage_t    *st = &ctx->stages[0];
    kvl_ss_live_t  *ls;

    servers = ss->conf.servers;

    if (servers < st->nbackends) {
        servers = (unsigned) st->nbackends;
    }

    top = 0;
    total = 0;

    for (b = 0; b < st->nbackends; b++) {
        total += st->backends[b].requests;
        top = st->backends[b].requests > top ? st->backends[b].requests
                                             : top;
    }

    mean = servers ? (double) total / servers : 0.0;
    busiest = mean > 0.0 ? top / mean : 0.0;

    /* each session's share of its requests on its most used server */
    all = 0;
    counted = 0;
    share_sum = 0.0;
    share_min = 1.0;
    reqs = 0;

    for (i = 0; i < ss->set.n; i++) {
        ls = &ss->live[i];
        reqs += ls->s->nreqs;

        if (ls->done == 0) {
            continue;
        }

        for (most = 0, b = 0; b < KVL_MAX_BACKENDS; b++) {
            most = ls->by[b] > most ? ls->by[b] : most;
        }

        share = (double) most / ls->done;
        share_sum += share;
        share_min = share < share_min ? share : share_min;
        all += most;
        counted++;
    }

    span = ss->t_area - ss->t0;
    live_mean = span > 0.0 ? ss->open_area / span : 0.0;
    context_mean = span > 0.0 ? ss->context_area / span : 0.0;

    o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f,"
                  " s:b, s:s, s:I, s:f, s:f, s:f, s:f}",
                  "sessions", (json_int_t) ss->set.n,
                  "sessions_run", (json_int_t) counted,
                  "requests", (json_int_t) reqs,
                  "subagent_requests", (json_int_t) ss->sub_requests,
                  "held_by_thread", (json_int_t) ss->held,
                  "servers", (json_int_t) servers,
                  "busiest_requests", (json_int_t) top,
                  "busiest_share", busiest,
                  "session_top_share_mean",
                  counted ? share_sum / counted : 0.0,
                  "session_top_share_min", counted ? share_min : 0.0,
                  "session_top_share_requests",
                  st->completed ? (double) all / st->completed : 0.0,
                  "shared_prefix", (int) ss->conf.shared_prefix,
                  "header", ss->conf.header ? ss->conf.header : "",
                  "live", (json_int_t) ss->conf.live,
                  "rate", ss->conf.rate,
                  "idle_max", ss->conf.idle_max,
                  "live_mean", live_mean,
                  "live_context_tokens_mean", context_mean);

    if (o == NULL || json_object_set_new(root, "sessions", o) != 0) {
        return -1;
    }

    printf("# sessions %s: %zu sessions, %llu requests sent (%llu of "
           "sub-agents, %llu held for their thread), %s, on %u servers: "
           "busiest server %.2f x the mean of requests; a session's "
           "requests on its most used server %.1f%% (mean of sessions; "
           "lowest %.1f%%); %.1f sessions open, %.0f tokens of context "
           "(time means)\n",
           ctx->label, ss->set.n, (unsigned long long) st->sent,
           (unsigned long long) ss->sub_requests,
           (unsigned long long) ss->held,
           ss->conf.shared_prefix ? "system + tools shared by all"
                                  : "sessions share nothing",
           servers, busiest, counted ? 100.0 * share_sum / counted : 0.0,
           counted ? 100.0 * share_min : 0.0, live_mean, context_mean);

    for (b = 0; b < st->nbackends; b++) {
        printf("#   %-24s %llu requests\n", st->backends[b].name,
               (unsigned long long) st->backends[b].requests);
    }

    fflush(stdout);

    kvl_ss_set_free(&ss->set);
    free(ss->body);
    ss->body = NULL;

    return 0;
}
