/*
 * kvsim: a decode server's side of disaggregation.
 *
 * A request with vLLM's leg 2 params, SGLang's bootstrap fields, or (with
 * --sidecar) llm-d's x-prefiller-host-port header is held back from the
 * scheduler (r->pending) while this file:
 *
 *   sidecar: runs leg 1 itself, the client's body as vLLM's proxy rewrites
 *     it, with the client's X-Request-Id, and takes the answer's
 *     kv_transfer_params as vLLM's leg 2;
 *   pulls (POST /kv/pull, kvsim_pd.c) only the prompt blocks the local
 *     cache lacks, checking their keys against its own; a room that is not
 *     ready yet is asked again every 10 ms;
 *   waits the transfer time, blocks x --block-tokens x --kv-token-bytes at
 *     --kv-bandwidth GB/s, divided by --time-scale;
 *   puts the blocks into the cache (they go out in this server's events),
 *     pinned until the sequence is admitted, where they are prefix hits.
 *
 * Anything that fails (unusable params, the prefill unreachable, refusing,
 * or silent for --pd-wait-s, keys that differ) serves the request
 * aggregated: the decode computes the prompt, counted and logged.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "kvsim_http.h"
#include "kvsim_pd.h"
#include "kvsim_pull.h"


#define KVS_PULL_BODY_MAX   (4 * 1024 * 1024)   /* an answer, at most */
#define KVS_PULL_RETRY_MS   10


typedef enum {
    KVS_PULL_LEG1 = 0,                  /* sidecar: leg 1 in flight */
    KVS_PULL_ASK,                       /* the pull in flight */
    KVS_PULL_RETRY,                     /* a room not ready: the timer */
    KVS_PULL_XFER,                      /* the transfer's time: the timer */
    KVS_PULL_ADMIT                      /* submitted, blocks pinned */
} kvs_pull_state_e;


struct kvs_pull_s {
    kvs_req_t                  *r;
    kvs_server_t               *srv;
    struct evhttp_connection   *evcon;  /* in flight */
    struct evhttp_request      *hreq;
    struct event               *timer;
    double                      start;  /* ms */
    kvs_pull_state_e            state;
    unsigned                    not_ready:1;  /* the room said 409 */
    uint32_t                    first;  /* blocks held locally */
    uint32_t                    n;      /* blocks pulled */
    uint32_t                    npins;
    uint32_t                    pins[];
};


static void kvs_pull_leg1(kvs_pull_t *p);
static void kvs_pull_leg1_done(struct evhttp_request *req, void *arg);
static void kvs_pull_ask(kvs_pull_t *p);
static void kvs_pull_ask_done(struct evhttp_request *req, void *arg);
static int kvs_pull_verify(kvs_pull_t *p, json_t *root);
static void kvs_pull_timer(evutil_socket_t fd, short what, void *arg);
static void kvs_pull_insert(kvs_pull_t *p);
static void kvs_pull_fallback(kvs_pull_t *p, const char *why, int timeout);
static int kvs_pull_send(kvs_pull_t *p, const char *uri, const char *body,
    size_t len, void (*cb)(struct evhttp_request *, void *));
static json_t *kvs_pull_answer(kvs_pull_t *p, struct evhttp_request *req,
    int *code);
static void kvs_evcon_free(evutil_socket_t fd, short what, void *arg);
static void kvs_pull_free(kvs_pull_t *p);


void
kvs_pull_start(kvs_req_t *r)
{
    kvs_pull_t       *p;
    kvs_pd_params_t  *pd = r->pd;

    p = calloc(1, sizeof(kvs_pull_t) + r->seq->nhashes * sizeof(uint32_t));

    if (p != NULL) {
        p->timer = evtimer_new(r->srv->sim->base, kvs_pull_timer, p);
        if (p->timer == NULL) {
            free(p);
            p = NULL;
        }
    }

    pd->mode = pd->sidecar ? "sidecar" : pd->bootstrap ? "sglang" : "vllm";

    if (p == NULL) {
        pd->fallback = "out of memory";
        r->srv->pd.fallbacks++;
        kvs_request_submit(r);
        return;
    }

    if (pd->bootstrap) {
        snprintf(pd->remote_id, sizeof(pd->remote_id), "room:%llu",
                 (unsigned long long) pd->room);
    }

    p->r = r;
    p->srv = r->srv;
    p->start = kvs_now_ms();
    r->pull = p;

    if (pd->sidecar) {
        kvs_pull_leg1(p);

    } else if (pd->remote_prefill && !pd->usable) {
        kvs_pull_fallback(p, "unusable kv_transfer_params", 0);

    } else {
        kvs_pull_ask(p);
    }
}


/*
 * llm-d's sidecar: leg 1 as vLLM's proxy sends it, the client's body with
 * stream false, one token, no stream_options, min_tokens or
 * min_completion_tokens, and the params asking for a remote decode.
 */
static void
kvs_pull_leg1(kvs_pull_t *p)
{
    char              *s;
    size_t             len;
    json_t            *root, *kv;
    kvs_req_t         *r = p->r;
    kvs_pd_params_t   *pd = r->pd;
    json_error_t       err;
    struct evbuffer   *in;

    in = evhttp_request_get_input_buffer(r->req);
    len = evbuffer_get_length(in);
    root = json_loadb((const char *) evbuffer_pullup(in, -1), len,
                      JSON_ALLOW_NUL, &err);
    kv = json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1,
                   "do_remote_prefill", 0, "remote_engine_id",
                   "remote_block_ids", "remote_host", "remote_port");
    s = NULL;

    if (root != NULL && kv != NULL) {
        json_object_set_new(root, "stream", json_false());
        json_object_set_new(root, "max_tokens", json_integer(1));

        if (json_object_get(root, "max_completion_tokens")) {
            json_object_set_new(root, "max_completion_tokens",
                                json_integer(1));
        }

        json_object_del(root, "stream_options");
        json_object_del(root, "min_tokens");
        json_object_del(root, "min_completion_tokens");
        json_object_set(root, "kv_transfer_params", kv);
        s = json_dumps(root, JSON_COMPACT);
    }

    json_decref(kv);
    json_decref(root);

    if (pd->request_id[0] == '\0') {
        snprintf(pd->request_id, sizeof(pd->request_id), "kvsim-%u-%llu",
                 r->srv->port, (unsigned long long) r->id);
    }

    p->state = KVS_PULL_LEG1;
    r->srv->pd.sidecar_legs++;

    if (s == NULL
        || kvs_pull_send(p, r->chat ? "/v1/chat/completions"
                                    : "/v1/completions",
                         s, strlen(s), kvs_pull_leg1_done) != 0)
    {
        free(s);
        kvs_pull_fallback(p, "leg 1 not sent", 0);
        return;
    }

    free(s);
}


static void
kvs_pull_leg1_done(struct evhttp_request *req, void *arg)
{
    int               code;
    json_t           *root;
    kvs_pull_t       *p = arg;
    kvs_pd_params_t   np, *pd;

    root = kvs_pull_answer(p, req, &code);

    if (root == NULL) {
        kvs_pull_fallback(p, code < 0 ? "prefill timed out"
                             : code ? "prefill failed" : "prefill unreachable",
                          code < 0);
        return;
    }

    memset(&np, 0, sizeof(np));
    pd = p->r->pd;

    if (kvs_pd_params(root, &np) != 0 || !np.remote_prefill || !np.usable) {
        json_decref(root);
        free(np.block_ids);
        kvs_pull_fallback(p, "prefill answered no usable "
                          "kv_transfer_params", 0);
        return;
    }

    json_decref(root);

    memcpy(pd->host, np.host, sizeof(pd->host));
    memcpy(pd->remote_id, np.remote_id, sizeof(pd->remote_id));
    memcpy(pd->engine_id, np.engine_id, sizeof(pd->engine_id));
    pd->port = np.port;
    free(pd->block_ids);
    pd->block_ids = np.block_ids;
    pd->nblock_ids = np.nblock_ids;
    pd->remote_prefill = 1;
    pd->usable = 1;

    kvs_pull_ask(p);
}


/* POST /kv/pull for the blocks from the first one not held here */
static void
kvs_pull_ask(kvs_pull_t *p)
{
    uint32_t          i, n;
    kvs_req_t        *r = p->r;
    kvs_pd_params_t  *pd = r->pd;
    struct evbuffer  *b;

    p->first = kvs_cache_match(&r->srv->cache, r->seq->hashes,
                               r->seq->nhashes);
    p->state = KVS_PULL_ASK;

    b = evbuffer_new();
    if (b == NULL) {
        kvs_pull_fallback(p, "out of memory", 0);
        return;
    }

    if (pd->bootstrap) {
        evbuffer_add_printf(b, "{\"id\":\"room:%llu\",\"first_block\":%u}",
                            (unsigned long long) pd->room, p->first);

    } else {
        n = pd->nblock_ids < r->seq->nhashes ? pd->nblock_ids
                                             : r->seq->nhashes;
        evbuffer_add_printf(b, "{\"id\":\"%s\",\"block_ids\":[",
                            pd->remote_id);

        for (i = p->first; i < n; i++) {
            evbuffer_add_printf(b, "%s%u", i > p->first ? "," : "",
                                pd->block_ids[i]);
        }

        evbuffer_add(b, "]}", 2);
    }

    if (kvs_pull_send(p, "/kv/pull",
                      (const char *) evbuffer_pullup(b, -1),
                      evbuffer_get_length(b), kvs_pull_ask_done) != 0)
    {
        evbuffer_free(b);
        kvs_pull_fallback(p, "pull not sent", 0);
        return;
    }

    evbuffer_free(b);
}


static void
kvs_pull_ask_done(struct evhttp_request *req, void *arg)
{
    int              code;
    double           s;
    json_t          *root;
    kvs_pull_t      *p = arg;
    kvs_conf_t      *conf;
    struct timeval   tv;

    root = kvs_pull_answer(p, req, &code);
    conf = &p->srv->sim->conf;

    if (code == 409 && p->r->pd->bootstrap
        && kvs_now_ms() + KVS_PULL_RETRY_MS
           < p->start + conf->pd_wait_s * 1000.0)
    {
        /* the prefill has not finished (or started) the room yet */
        json_decref(root);
        p->not_ready = 1;
        p->srv->pd.bootstrap_retries++;
        p->state = KVS_PULL_RETRY;
        tv.tv_sec = 0;
        tv.tv_usec = KVS_PULL_RETRY_MS * 1000;
        evtimer_add(p->timer, &tv);
        return;
    }

    /*
     * a room that answered "not ready" and then ran out of time (its last
     * ask still out at the deadline, on a loaded machine) was never ready:
     * say so rather than blame the link
     */
    if (root == NULL && p->not_ready && code < 0) {
        code = 409;
    }

    if (root == NULL || kvs_pull_verify(p, root) != 0) {
        json_decref(root);
        kvs_pull_fallback(p, code == 200 ? "pulled blocks keyed differently"
                             : code == 409 ? "bootstrap room never ready"
                             : code > 0 ? "pull refused"
                             : code < 0 ? "pull timed out"
                             : "prefill unreachable", code < 0);
        return;
    }

    json_decref(root);

    /* what the read costs: the bytes at the link's bandwidth */
    s = (double) p->n * conf->block_tokens * conf->kv_token_bytes
        / (conf->kv_bandwidth * 1e9) / conf->time_scale;

    p->srv->pd.pulls++;
    p->srv->pd.blocks_pulled += p->n;
    p->srv->pd.bytes_pulled += (uint64_t) p->n * conf->block_tokens
                               * conf->kv_token_bytes;

    p->state = KVS_PULL_XFER;
    tv.tv_sec = (time_t) s;
    tv.tv_usec = (suseconds_t) ((s - tv.tv_sec) * 1e6);
    evtimer_add(p->timer, &tv);
}


/* the answer's keys are ours from p->first on: p->n of them; -1: none */
static int
kvs_pull_verify(kvs_pull_t *p, json_t *root)
{
    size_t       k, n;
    json_t      *h, *e;
    uint64_t     v;
    kvs_seq_t   *seq = p->r->seq;
    const char  *s;
    char        *end;

    h = json_object_get(root, "hashes");
    if (!json_is_array(h)) {
        return -1;
    }

    n = json_array_size(h);
    p->n = 0;

    for (k = 0; k < n && p->first + k < seq->nhashes; k++) {
        e = json_array_get(h, k);
        s = json_is_string(e) ? json_string_value(e) : "";
        v = strtoull(s, &end, 16);

        if (*s == '\0' || *end != '\0' || v != seq->hashes[p->first + k]) {
            break;
        }

        p->n++;
    }

    return (n && p->n == 0) ? -1 : 0;
}


static void
kvs_pull_timer(evutil_socket_t fd, short what, void *arg)
{
    kvs_pull_t  *p = arg;

    if (p->state == KVS_PULL_RETRY) {
        kvs_pull_ask(p);

    } else {
        kvs_pull_insert(p);
    }
}


/*
 * The blocks held here and the ones pulled, pinned in prompt order until
 * the sequence's admission finds them; a local one evicted meanwhile ends
 * the run (the rest is computed), as does a full cache.
 */
static void
kvs_pull_insert(kvs_pull_t *p)
{
    uint32_t             b, x, bt;
    kvs_req_t           *r = p->r;
    kvs_seq_t           *seq = r->seq;
    kvs_cache_t         *c = &r->srv->cache;
    kvs_engine_block_t   eb;

    bt = r->srv->sim->conf.block_tokens;

    for (b = 0; b < p->first + p->n && b < seq->nhashes; b++) {
        x = kvs_cache_lookup(c, seq->hashes[b]);

        if (x != KVS_NIL) {
            kvs_cache_acquire(c, x);
            p->pins[p->npins++] = x;
            continue;
        }

        if (b < p->first || (x = kvs_cache_alloc(c)) == KVS_NIL) {
            break;
        }

        p->pins[p->npins++] = x;

        if (seq->ehashes == NULL) {
            kvs_cache_commit(c, x, seq->hashes[b],
                             b ? seq->hashes[b - 1] : 0);
            continue;
        }

        eb.ids = &seq->ids[(size_t) b * bt];
        eb.nids = bt;
        eb.lora = seq->lora;
        eb.ehash = seq->ehashes[b];
        eb.eparent = b ? seq->ehashes[b - 1] : 0;
        kvs_cache_commit_engine(c, x, seq->hashes[b],
                                b ? seq->hashes[b - 1] : 0, &eb);
    }

    r->pd->local = p->first;
    r->pd->pulled = p->n;
    p->state = KVS_PULL_ADMIT;

    kvs_request_submit(r);
}


static void
kvs_pull_fallback(kvs_pull_t *p, const char *why, int timeout)
{
    kvs_req_t     *r = p->r;
    kvs_server_t  *srv = p->srv;

    r->pd->fallback = why;
    r->pull = NULL;
    kvs_pull_free(p);

    srv->pd.fallbacks++;

    if (timeout) {
        srv->pd.pull_timeouts++;

    } else if (strcmp(why, "unusable kv_transfer_params") != 0) {
        srv->pd.pull_failures++;
    }

    if (!srv->sim->conf.quiet
        && (srv->pd.fallbacks & (srv->pd.fallbacks - 1)) == 0)
    {
        fprintf(stderr, "kvsim: %s: %s (%s): served aggregated "
                "(%llu so far)\n", srv->id, why, r->pd->mode,
                (unsigned long long) srv->pd.fallbacks);
    }

    kvs_request_submit(r);
}


static int
kvs_pull_send(kvs_pull_t *p, const char *uri, const char *body, size_t len,
    void (*cb)(struct evhttp_request *, void *))
{
    char                       host[80];
    double                     left;
    kvs_pd_params_t           *pd = p->r->pd;
    struct timeval             tv;
    struct evkeyvalq          *h;
    struct evhttp_request     *req;
    struct evhttp_connection  *evcon;

    left = p->start + p->srv->sim->conf.pd_wait_s * 1000.0 - kvs_now_ms();
    if (left < 1.0) {
        left = 1.0;
    }

    /* an IPv4 literal (kvsim_pd.c checked): nothing to resolve */
    evcon = evhttp_connection_base_new(p->srv->sim->base, NULL, pd->host,
                                       pd->port);
    if (evcon == NULL) {
        return -1;
    }

    tv.tv_sec = (time_t) (left / 1000.0);
    tv.tv_usec = (suseconds_t) ((left - tv.tv_sec * 1000.0) * 1000.0);
    evhttp_connection_set_timeout_tv(evcon, &tv);
    evhttp_connection_set_retries(evcon, 0);
    evhttp_connection_set_max_body_size(evcon, KVS_PULL_BODY_MAX);

    req = evhttp_request_new(cb, p);
    if (req == NULL) {
        evhttp_connection_free(evcon);
        return -1;
    }

    snprintf(host, sizeof(host), "%s:%u", pd->host, pd->port);
    h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");

    if (pd->request_id[0]) {
        evhttp_add_header(h, "X-Request-Id", pd->request_id);
    }

    if (evbuffer_add(evhttp_request_get_output_buffer(req), body, len) != 0
        || evhttp_make_request(evcon, req, EVHTTP_REQ_POST, uri) != 0)
    {
        evhttp_request_free(req);
        evhttp_connection_free(evcon);
        return -1;
    }

    p->evcon = evcon;
    p->hreq = req;

    return 0;
}


/*
 * A JSON object of a 200 answer, or NULL with *code: the status, 0 no
 * answer, -1 none in the time allowed; the connection freed after the
 * callback returns (libevent still uses it).
 */
static json_t *
kvs_pull_answer(kvs_pull_t *p, struct evhttp_request *req, int *code)
{
    size_t            len;
    json_t           *root;
    json_error_t      err;
    struct timeval    tv;
    struct evbuffer  *in;

    tv.tv_sec = 0;
    tv.tv_usec = 0;
    event_base_once(p->srv->sim->base, -1, EV_TIMEOUT, kvs_evcon_free,
                    p->evcon, &tv);
    p->evcon = NULL;
    p->hreq = NULL;

    *code = req ? evhttp_request_get_response_code(req) : 0;

    if (*code == 0) {
        if (kvs_now_ms() + 5.0
            >= p->start + p->srv->sim->conf.pd_wait_s * 1000.0)
        {
            *code = -1;
        }

        return NULL;
    }

    in = evhttp_request_get_input_buffer(req);
    len = evbuffer_get_length(in);
    root = json_loadb((const char *) evbuffer_pullup(in, -1), len, 0, &err);

    if (root != NULL && (*code != 200 || !json_is_object(root))) {
        json_decref(root);
        root = NULL;
    }

    return root;
}


static void
kvs_evcon_free(evutil_socket_t fd, short what, void *arg)
{
    evhttp_connection_free(arg);
}


void
kvs_pull_cancel(kvs_req_t *r)
{
    kvs_pull_t  *p = r->pull;

    if (p == NULL) {
        return;
    }

    r->pull = NULL;

    if (p->evcon != NULL) {
        /* the answer's callback is never called */
        evhttp_cancel_request(p->hreq);
        evhttp_connection_free(p->evcon);
    }

    kvs_pull_free(p);
}


void
kvs_pull_admitted(kvs_req_t *r)
{
    kvs_pull_t  *p = r->pull;

    r->pull = NULL;
    kvs_pull_free(p);
}


static void
kvs_pull_free(kvs_pull_t *p)
{
    while (p->npins) {
        kvs_cache_release(&p->srv->cache, p->pins[--p->npins]);
    }

    event_free(p->timer);
    free(p);
}
