/*
 * kvload agent workload.  Every conversation of a coding or tool-using
 * agent resends, each turn, one system prompt shared by all of them, its
 * first user message (the task and its context) and every earlier turn:
 * the assistant's tool call and the tool's result.  A turn is sent when
 * the one before it has finished and a think time has passed, so the
 * servers see one turn of a conversation at a time and, between turns,
 * nothing of it but what their caches hold.
 *
 *   turn 0   system, user
 *   turn t   system, user, (assistant, tool) x t
 *
 * At most `concurrency` conversations are open; when one ends the next
 * opens.  What a user of a router wants to know, reported at the end:
 * did later turns go where their conversation started (the server that
 * holds its history), were the conversations spread over the servers,
 * and how much of the prompts came from cache.  The server that answered
 * is read from kvsim's X-Kvsim-Server header, then the X-Upstream-Addr
 * header a proxy may add, then kvsim's "kvsim" object in the stream.
 */

#define _GNU_SOURCE                     /* memmem() */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_rand.h"
#include "kvload_agent.h"


/* which text: seeds apart */
#define KVL_AG_SYSTEM     1
#define KVL_AG_USER       2
#define KVL_AG_CALL       3
#define KVL_AG_RESULT     4


typedef struct kvl_agent_s  kvl_agent_t;

typedef struct {
    kvl_http_req_t      http;
    kvl_agent_t        *ag;
    struct event       *timer;
    unsigned            id;
    unsigned            turn;
    unsigned            open:1;
    unsigned            moved:1;
    double              t_sent;
    double              t_first;
    double              t_last;
    uint64_t            chunks;
    uint64_t            prompt_tokens;
    uint64_t            cached_tokens;
    unsigned            failed:1;
    char                backend[KVL_BACKEND_LEN];
    char                home[KVL_BACKEND_LEN];    /* of turn 0 */
} kvl_conv_t;


struct kvl_agent_s {
    kvl_ctx_t          *ctx;
    kvl_agent_conf_t    conf;
    kvl_conv_t         *convs;
    unsigned            next;           /* conversation to open next */
    unsigned            open;
    uint64_t            rng;            /* think times */
    char               *body;
    size_t              len;
    size_t              cap;

    uint64_t            first_turns;
    uint64_t            later_turns;
    uint64_t            later_home;     /* on their conversation's server */
    uint64_t            moved;          /* conversations that left home */
    uint64_t            first_prompt, first_cached;
    uint64_t            later_prompt, later_cached;
    uint64_t            failed_convs;
    kvl_stage_t         homes;          /* conversations per server */
};


static kvl_agent_t  kvl_agent;


static void kvl_agent_open(kvl_agent_t *ag, double delay);
static void kvl_agent_schedule(kvl_conv_t *cv, double delay);
static void kvl_agent_fire(evutil_socket_t fd, short what, void *arg);
static int kvl_agent_body(kvl_agent_t *ag, kvl_conv_t *cv);
static void kvl_agent_message(kvl_agent_t *ag, const char *role,
    unsigned kind, unsigned conv, unsigned turn, unsigned tokens);
static void kvl_agent_append(kvl_agent_t *ag, const char *s, size_t n);
static void kvl_agent_event(kvl_http_req_t *hr, const char *d, size_t len,
    double now);
static void kvl_agent_done(kvl_http_req_t *hr);
static void kvl_agent_close(kvl_conv_t *cv);
static double kvl_agent_think(kvl_agent_t *ag);


int
kvl_agent_run(kvl_ctx_t *ctx, const kvl_agent_conf_t *ac)
{
    unsigned      i, n;
    kvl_agent_t  *ag = &kvl_agent;

    ag->ctx = ctx;
    ag->conf = *ac;
    ag->rng = ctx->wl.seed ^ 0x6167656e74730000ULL;

    n = ctx->wl.groups;

    if (ag->conf.concurrency == 0 || ag->conf.concurrency > n) {
        ag->conf.concurrency = n;
    }

    ag->convs = calloc(n, sizeof(kvl_conv_t));
    if (ag->convs == NULL) {
        return -1;
    }

    for (i = 0; i < n; i++) {
        ag->convs[i].id = i;
        ag->convs[i].ag = ag;
        ag->convs[i].timer = evtimer_new(ctx->base, kvl_agent_fire,
                                         &ag->convs[i]);
        if (ag->convs[i].timer == NULL) {
            return -1;
        }
    }

    ctx->nstages = 1;
    ctx->stages[0].qps = 0.0;          /* closed loop: no target rate */
    ctx->cur = 0;
    ctx->arriving = 1;
    ctx->stages[0].t_start = kvl_now();

    /* the first ones open over two think times, not all in one instant */
    for (i = 0; i < ag->conf.concurrency; i++) {
        kvl_agent_open(ag, 2.0 * kva_rand_unit(&ag->rng) * ag->conf.think_ms
                           / 1000.0);
    }

    return event_base_dispatch(ctx->base) < 0 ? -1 : 0;
}


static void
kvl_agent_open(kvl_agent_t *ag, double delay)
{
    kvl_conv_t  *cv;

    if (ag->next == ag->ctx->wl.groups || ag->ctx->stopping) {
        return;
    }

    cv = &ag->convs[ag->next++];
    cv->open = 1;
    ag->open++;

    kvl_agent_schedule(cv, delay);
}


/* delay in uncompressed seconds */
static void
kvl_agent_schedule(kvl_conv_t *cv, double delay)
{
    double          d;
    struct timeval  tv;

    d = delay / cv->ag->ctx->scale;
    tv.tv_sec = (time_t) d;
    tv.tv_usec = (suseconds_t) ((d - (double) tv.tv_sec) * 1e6);

    evtimer_add(cv->timer, &tv);
}


static void
kvl_agent_fire(evutil_socket_t fd, short what, void *arg)
{
    kvl_conv_t   *cv = arg;
    kvl_agent_t  *ag = cv->ag;
    kvl_ctx_t    *ctx = ag->ctx;
    kvl_stage_t  *st = &ctx->stages[0];

    if (ctx->stopping) {
        kvl_agent_close(cv);
        return;
    }

    memset(&cv->http, 0, sizeof(kvl_http_req_t));
    cv->http.target = &ctx->server;
    cv->http.on_event = kvl_agent_event;
    cv->http.done = kvl_agent_done;
    cv->http.data = cv;
    cv->chunks = 0;
    cv->prompt_tokens = 0;
    cv->cached_tokens = 0;
    cv->failed = 0;
    cv->backend[0] = '\0';

    st->sent++;

    if (kvl_agent_body(ag, cv) != 0) {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);
    }

    cv->t_sent = kvl_now();

    if (kvl_http_send(&cv->http, "/v1/chat/completions", ag->body, ag->len,
                      ctx->timeout / ctx->scale)
        != 0)
    {
        st->errors++;

        if (cv->http.buf) {
            evbuffer_free(cv->http.buf);
        }

        if (cv->http.again) {
            evbuffer_free(cv->http.again);
        }

        ag->failed_convs++;
        kvl_agent_close(cv);
        return;
    }

    st->inflight++;
    ctx->inflight++;
}


static int
kvl_agent_body(kvl_agent_t *ag, kvl_conv_t *cv)
{
    char            tail[160];
    unsigned        k;
    kvl_wl_conf_t  *c = &ag->ctx->wl;
    kvl_agent_conf_t  *ac = &ag->conf;

    ag->len = 0;

    snprintf(tail, sizeof(tail), "{\"model\":\"%s\",\"messages\":[",
             c->model);
    kvl_agent_append(ag, tail, strlen(tail));

    kvl_agent_message(ag, "system", KVL_AG_SYSTEM, 0, 0, c->system_tokens);
    kvl_agent_message(ag, "user", KVL_AG_USER, cv->id, 0, c->question_tokens);

    for (k = 0; k < cv->turn; k++) {
        kvl_agent_message(ag, "assistant", KVL_AG_CALL, cv->id, k,
                          c->output_tokens);
        kvl_agent_message(ag, "tool", KVL_AG_RESULT, cv->id, k,
                          ac->tool_tokens);
    }

    ag->len--;                          /* the comma after the last one */

    snprintf(tail, sizeof(tail), "],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},"
             "\"max_tokens\":%u,\"ignore_eos\":true}", c->output_tokens);
    kvl_agent_append(ag, tail, strlen(tail));

    return ag->body ? 0 : -1;
}


/* the same text for the same (kind, conversation, turn), every run */
static void
kvl_agent_message(kvl_agent_t *ag, const char *role, unsigned kind,
    unsigned conv, unsigned turn, unsigned tokens)
{
    char                head[64];
    uint64_t            rng, r;
    unsigned            i;
    static const char   a[] = "abcdefghijklmnopqrstuvwxyz0123456789";

    rng = ag->ctx->wl.seed * 0x9e3779b97f4a7c15ULL
          ^ ((uint64_t) kind << 56) ^ ((uint64_t) conv << 24) ^ turn;

    snprintf(head, sizeof(head), "{\"role\":\"%s\",\"content\":\"", role);
    kvl_agent_append(ag, head, strlen(head));

    for (i = 0; i < tokens; i++) {
        r = kva_rand_next(&rng);
        head[0] = a[r % 36];
        head[1] = a[(r >> 8) % 36];
        head[2] = a[(r >> 16) % 36];
        head[3] = ' ';
        kvl_agent_append(ag, head, 4);
    }

    kvl_agent_append(ag, "\"},", 3);
}


static void
kvl_agent_append(kvl_agent_t *ag, const char *s, size_t n)
{
    char    *b;
    size_t   cap;

    if (ag->len + n > ag->cap) {
        for (cap = ag->cap ? ag->cap : 65536; cap < ag->len + n; cap *= 2) {
            /* void */
        }

        b = realloc(ag->body, cap);
        if (b == NULL) {
            free(ag->body);
            ag->body = NULL;
            ag->len = 0;
            ag->cap = 0;
            return;
        }

        ag->body = b;
        ag->cap = cap;
    }

    if (ag->body) {
        memcpy(ag->body + ag->len, s, n);
        ag->len += n;
    }
}


static void
kvl_agent_event(kvl_http_req_t *hr, const char *d, size_t len, double now)
{
    json_t      *root;
    const char  *server;
    json_int_t   pt = 0, cached = 0;
    kvl_conv_t  *cv = hr->data;

    if (memmem(d, len, "\"content\":\"", 11) != NULL
        && memmem(d, len, "\"content\":\"\"", 12) == NULL)
    {
        if (cv->chunks++ == 0) {
            cv->t_first = now;

        } else if (kvl_samples_add(&cv->ag->ctx->stages[0].gap,
                                   now - cv->t_last)
                   != 0)
        {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }

        cv->t_last = now;
        cv->ag->ctx->stages[0].window_tokens++;
    }

    /* only the chunks worth a parse: the first, the usage, an error */

    if (memmem(d, len, "\"usage\":{", 9) == NULL
        && (cv->backend[0] || memmem(d, len, "\"kvsim\"", 7) == NULL)
        && memmem(d, len, "\"error\"", 7) == NULL)
    {
        return;
    }

    root = json_loadb(d, len, 0, NULL);

    if (root == NULL || json_is_object(json_object_get(root, "error"))) {
        cv->failed = 1;
    }

    if (json_unpack(root, "{s:{s:s}}", "kvsim", "server", &server) == 0) {
        snprintf(cv->backend, sizeof(cv->backend), "%s", server);
    }

    if (json_unpack(root, "{s:{s?I, s?{s?I}}}", "usage",
                    "prompt_tokens", &pt,
                    "prompt_tokens_details", "cached_tokens", &cached)
        == 0)
    {
        cv->prompt_tokens = pt;
        cv->cached_tokens = cached;
    }

    json_decref(root);
}


static void
kvl_agent_done(kvl_http_req_t *hr)
{
    kvl_conv_t   *cv = hr->data;
    kvl_agent_t  *ag = cv->ag;
    kvl_ctx_t    *ctx = ag->ctx;
    kvl_stage_t  *st = &ctx->stages[0];
    const char   *server;

    st->inflight--;
    ctx->inflight--;
    st->retried += hr->retries;

    server = hr->server[0] ? hr->server
             : hr->upstream[0] ? hr->upstream : cv->backend;

    if (hr->error != 0 || hr->status != 200 || cv->failed
        || cv->chunks == 0)
    {
        st->errors++;
        st->timeouts += (hr->error == KVL_HTTP_ETIMEOUT);
        st->http_5xx += (hr->status >= 500);
        st->cut += (hr->status == 200);

        if (ctx->errlog++ < 10) {
            fprintf(stderr, "kvload: conversation %u turn %u failed: %s, "
                    "HTTP %d%s\n", cv->id, cv->turn,
                    kvl_http_strerror(hr->error), hr->status,
                    cv->failed ? ", error in stream" : "");
        }

        /* its history is lost to the client: the conversation ends */
        ag->failed_convs++;
        evbuffer_free(hr->buf);

        if (hr->again) {
            evbuffer_free(hr->again);
        }

        kvl_agent_close(cv);
        return;
    }

    if (kvl_samples_add(&st->ttft, cv->t_first - cv->t_sent) != 0
        || kvl_samples_add(&st->e2e, hr->t_done - cv->t_sent) != 0)
    {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);
    }

    st->completed++;
    st->output_tokens += cv->chunks;
    st->prompt_tokens += cv->prompt_tokens;
    st->cached_tokens += cv->cached_tokens;
    kvl_stage_backend(st, server);

    if (cv->turn == 0) {
        snprintf(cv->home, sizeof(cv->home), "%s", server);
        kvl_stage_backend(&ag->homes, server);
        ag->first_turns++;
        ag->first_prompt += cv->prompt_tokens;
        ag->first_cached += cv->cached_tokens;

    } else {
        ag->later_turns++;
        ag->later_prompt += cv->prompt_tokens;
        ag->later_cached += cv->cached_tokens;

        if (strcmp(server, cv->home) == 0) {
            ag->later_home++;

        } else if (!cv->moved) {
            cv->moved = 1;
            ag->moved++;
        }
    }

    evbuffer_free(hr->buf);

    if (hr->again) {
        evbuffer_free(hr->again);
    }

    if (++cv->turn < ctx->wl.turns && !ctx->stopping) {
        kvl_agent_schedule(cv, kvl_agent_think(ag));
        return;
    }

    kvl_agent_close(cv);
}


static void
kvl_agent_close(kvl_conv_t *cv)
{
    kvl_agent_t  *ag = cv->ag;
    kvl_ctx_t    *ctx = ag->ctx;

    if (!cv->open) {
        return;
    }

    cv->open = 0;
    ag->open--;

    kvl_agent_open(ag, kvl_agent_think(ag));

    if (ag->open == 0) {
        ctx->arriving = 0;
        ctx->stages[0].t_arrivals_end = kvl_now();
        event_base_loopexit(ctx->base, NULL);
    }
}


/* exponential, mean think_ms, in uncompressed seconds */
static double
kvl_agent_think(kvl_agent_t *ag)
{
    return -log(1.0 - kva_rand_unit(&ag->rng)) * ag->conf.think_ms / 1000.0;
}


int
kvl_agent_report(kvl_ctx_t *ctx, json_t *root)
{
    size_t        i;
    json_t       *o, *by;
    double        mean, busiest, home_share, hit, first_hit, later_hit;
    unsigned      servers;
    uint64_t      most, convs;
    kvl_agent_t  *ag = &kvl_agent;
    kvl_stage_t  *st = &ctx->stages[0];

    /* the servers: as many as said, or at least those that answered */
    servers = ag->conf.servers;

    if (servers < st->nbackends) {
        servers = (unsigned) st->nbackends;
    }

    most = 0;
    convs = 0;

    for (i = 0; i < ag->homes.nbackends; i++) {
        convs += ag->homes.backends[i].requests;

        if (ag->homes.backends[i].requests > most) {
            most = ag->homes.backends[i].requests;
        }
    }

    mean = servers ? (double) convs / servers : 0.0;
    busiest = mean > 0.0 ? most / mean : 0.0;
    home_share = ag->later_turns ? (double) ag->later_home / ag->later_turns
                                 : 0.0;
    hit = kvl_hit_rate(st->cached_tokens, st->prompt_tokens);
    first_hit = kvl_hit_rate(ag->first_cached, ag->first_prompt);
    later_hit = kvl_hit_rate(ag->later_cached, ag->later_prompt);

    o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:f, s:f, s:f,"
                  " s:f, s:f, s:{}}",
                  "conversations", (json_int_t) convs,
                  "failed_conversations", (json_int_t) ag->failed_convs,
                  "servers", (json_int_t) servers,
                  "first_turns", (json_int_t) ag->first_turns,
                  "later_turns", (json_int_t) ag->later_turns,
                  "later_home", (json_int_t) ag->later_home,
                  "later_home_share", home_share,
                  "moved_conversations", (json_int_t) ag->moved,
                  "busiest_share", busiest,
                  "hit_rate", hit, "first_turn_hit_rate", first_hit,
                  "later_turn_hit_rate", later_hit,
                  "think_ms", ag->conf.think_ms,
                  "conversations_by_server");

    if (o == NULL || json_object_set_new(root, "agent", o) != 0) {
        return -1;
    }

    by = json_object_get(o, "conversations_by_server");

    for (i = 0; i < ag->homes.nbackends; i++) {
        if (json_object_set_new(by, ag->homes.backends[i].name,
                json_integer((json_int_t) ag->homes.backends[i].requests))
            != 0)
        {
            return -1;
        }
    }

    printf("# agent %s: %llu conversations on %u servers: later turns on "
           "their conversation's first server %.1f%% (%llu of %llu), "
           "busiest server %.2f x the mean of conversations, "
           "hit rate %.1f%% (first turns %.1f%%, later %.1f%%)\n",
           ctx->label, (unsigned long long) convs, servers,
           100.0 * home_share, (unsigned long long) ag->later_home,
           (unsigned long long) ag->later_turns, busiest, 100.0 * hit,
           100.0 * first_hit, 100.0 * later_hit);

    for (i = 0; i < ag->homes.nbackends; i++) {
        printf("#   %-24s %llu conversations\n", ag->homes.backends[i].name,
               (unsigned long long) ag->homes.backends[i].requests);
    }

    fflush(stdout);

    return 0;
}
