/*
 * kvsim: disaggregated prefill and decode, the request's side and the
 * prefill server's.
 *
 * A leg 1 (vLLM: "kv_transfer_params": {"do_remote_decode": true}; SGLang:
 * a prefill server given a "bootstrap_room") computes its prompt as any
 * request, and when it finishes its prompt's full blocks stay referenced
 * by a hold: pinned, not evictable, until a decode server pulls them or
 * --kv-hold-s passes (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
 *
 * POST /kv/pull stands in for NIXL's read: a decode server names the hold
 * (the remote_request_id, or "room:N") and the blocks it lacks; the answer
 * is each block's key, which the decode checks against its own, and the
 * hold is released, as vLLM frees a request's blocks once its decode has
 * read them.  The bytes themselves are not sent: the decode charges their
 * transfer time at --kv-bandwidth (kvsim_pull.c).
 */

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvsim_pd.h"
#include "kvsim_reply.h"


#define KVS_PD_BLOCKS_MAX   (1u << 20)  /* remote_block_ids, at most */


struct kvs_hold_s {
    kvs_hold_t         *next;
    kvs_server_t       *srv;
    struct event       *timer;
    char                id[KVS_PD_ID_MAX + 32];
    uint32_t            nblocks;
    uint32_t            blocks[];       /* referenced, in prompt order */
};


static int kvs_pd_transfer(json_t *o, kvs_pd_params_t *p);
static int kvs_pd_string(json_t *v, char *dst, size_t size);
static int kvs_pd_host(const char *s, size_t n, kvs_pd_params_t *p);
static kvs_hold_t *kvs_hold_find(kvs_server_t *srv, const char *id,
    kvs_hold_t ***prev);
static void kvs_hold_release(kvs_hold_t *h, kvs_hold_t **prev);
static void kvs_hold_expire(evutil_socket_t fd, short what, void *arg);
static void kvs_pd_bootstrap_handler(struct evhttp_request *req, void *arg);
static int kvs_pull_read(struct evhttp_request *req, char *id, size_t size,
    json_t **ids, long *first);


int
kvs_pd_params(json_t *root, kvs_pd_params_t *p)
{
    int          n;
    json_t      *v;
    json_int_t   i;
    const char  *s;

    v = json_object_get(root, "kv_transfer_params");

    if (json_is_object(v)) {
        if (kvs_pd_transfer(v, p) != 0) {
            return -1;
        }

    } else if (v != NULL && !json_is_null(v)) {
        p->bad = 1;
    }

    /* SGLang's three fields, all of them or none */
    n = 0;
    v = json_object_get(root, "bootstrap_host");

    if (json_is_string(v)) {
        s = json_string_value(v);
        n += (kvs_pd_host(s, strlen(s), p) == 0);
    }

    v = json_object_get(root, "bootstrap_port");
    i = json_is_integer(v) ? json_integer_value(v) : 0;

    if (i > 0 && i < 65536) {
        p->port = i;
        n++;
    }

    v = json_object_get(root, "bootstrap_room");

    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        p->room = json_integer_value(v);
        n++;
    }

    if (n == 3 && !p->remote_decode && !p->remote_prefill) {
        p->bootstrap = 1;

    } else if (n && n < 3) {
        p->bad = 1;
    }

    return 0;
}


/*
 * vLLM's object: leg 1 needs do_remote_decode only; leg 2 is usable with
 * do_remote_prefill, remote_request_id, remote_block_ids and an IPv4
 * remote_host with its port (a name would block the loop to resolve).
 */
static int
kvs_pd_transfer(json_t *o, kvs_pd_params_t *p)
{
    size_t       k;
    json_t      *v, *e;
    json_int_t   i;
    const char  *s;

    p->remote_decode = json_is_true(json_object_get(o, "do_remote_decode"));
    p->remote_prefill = json_is_true(json_object_get(o, "do_remote_prefill"));

    if (!p->remote_prefill || p->remote_decode) {
        p->remote_prefill = 0;
        return 0;
    }

    p->usable = 1;

    v = json_object_get(o, "remote_host");
    s = json_is_string(v) ? json_string_value(v) : "";

    if (kvs_pd_host(s, strlen(s), p) != 0) {
        p->usable = 0;
    }

    v = json_object_get(o, "remote_port");
    i = json_is_integer(v) ? json_integer_value(v) : 0;
    p->port = (i > 0 && i < 65536) ? i : 0;

    if (p->port == 0
        || kvs_pd_string(json_object_get(o, "remote_request_id"),
                         p->remote_id, sizeof(p->remote_id)) != 0)
    {
        p->usable = 0;
    }

    (void) kvs_pd_string(json_object_get(o, "remote_engine_id"),
                         p->engine_id, sizeof(p->engine_id));

    v = json_object_get(o, "remote_block_ids");

    if (!json_is_array(v) || json_array_size(v) > KVS_PD_BLOCKS_MAX) {
        p->usable = 0;
        return 0;
    }

    p->block_ids = malloc((json_array_size(v) + 1) * sizeof(uint32_t));
    if (p->block_ids == NULL) {
        return -1;
    }

    json_array_foreach(v, k, e) {
        i = json_is_integer(e) ? json_integer_value(e) : -1;

        if (i < 0 || i > UINT32_MAX) {
            p->usable = 0;
            return 0;
        }

        p->block_ids[p->nblock_ids++] = i;
    }

    return 0;
}


/* a printable token that a reply can carry unescaped, else -1 */
static int
kvs_pd_string(json_t *v, char *dst, size_t size)
{
    size_t       i, n;
    const char  *s;

    if (!json_is_string(v)) {
        return -1;
    }

    s = json_string_value(v);
    n = json_string_length(v);

    if (n == 0 || n >= size) {
        return -1;
    }

    for (i = 0; i < n; i++) {
        if (s[i] <= 0x20 || s[i] >= 0x7f || s[i] == '"' || s[i] == '\\') {
            return -1;
        }
    }

    memcpy(dst, s, n + 1);

    return 0;
}


static int
kvs_pd_host(const char *s, size_t n, kvs_pd_params_t *p)
{
    struct in_addr  a;

    if (n == 0 || n >= sizeof(p->host)) {
        return -1;
    }

    memcpy(p->host, s, n);
    p->host[n] = '\0';

    if (inet_pton(AF_INET, p->host, &a) != 1) {
        p->host[0] = '\0';
        return -1;
    }

    return 0;
}


/* X-Request-Id, and llm-d's x-prefiller-host-port on a sidecar */
void
kvs_pd_params_headers(kvs_server_t *srv, struct evhttp_request *req,
    kvs_pd_params_t *p)
{
    char              *end;
    json_t            *s;
    const char        *v, *colon;
    unsigned long      port;
    struct evkeyvalq  *in;

    in = evhttp_request_get_input_headers(req);
    v = evhttp_find_header(in, "X-Request-Id");

    if (v != NULL) {
        s = json_string(v);

        if (s == NULL || kvs_pd_string(s, p->request_id,
                                       sizeof(p->request_id)) != 0)
        {
            p->request_id[0] = '\0';
        }

        json_decref(s);
    }

    v = evhttp_find_header(in, "x-prefiller-host-port");

    if (v == NULL || !srv->sim->conf.sidecar) {
        return;
    }

    colon = strrchr(v, ':');
    port = colon ? strtoul(colon + 1, &end, 10) : 0;

    if (colon == NULL || colon[1] == '\0' || *end != '\0' || port == 0
        || port > 65535 || kvs_pd_host(v, colon - v, p) != 0)
    {
        p->bad = 1;
        return;
    }

    if (!p->remote_prefill && !p->remote_decode) {
        p->port = port;
        p->sidecar = 1;
        p->bootstrap = 0;
    }
}


void
kvs_pd_params_free(kvs_pd_params_t *p)
{
    if (p) {
        free(p->block_ids);
        free(p);
    }
}


/*
 * The prompt's full blocks, just released by the finished sequence and
 * still cached (nothing ran in between), taken back by the hold.
 */
int
kvs_pd_hold(kvs_server_t *srv, kvs_seq_t *seq, const char *id)
{
    uint32_t         i, b;
    kvs_hold_t      *h, **prev;
    struct timeval   tv;
    double           s;

    h = kvs_hold_find(srv, id, &prev);

    if (h != NULL) {
        kvs_hold_release(h, prev);      /* an id used again: the newest */
    }

    h = calloc(1, sizeof(kvs_hold_t) + seq->nhashes * sizeof(uint32_t));
    if (h == NULL) {
        return -1;
    }

    h->timer = evtimer_new(srv->sim->base, kvs_hold_expire, h);
    if (h->timer == NULL) {
        free(h);
        return -1;
    }

    h->srv = srv;
    snprintf(h->id, sizeof(h->id), "%s", id);

    for (i = 0; i < seq->nhashes; i++) {
        b = kvs_cache_lookup(&srv->cache, seq->hashes[i]);
        if (b == KVS_NIL) {
            break;
        }

        kvs_cache_acquire(&srv->cache, b);
        h->blocks[h->nblocks++] = b;
    }

    s = srv->sim->conf.kv_hold_s / srv->sim->conf.time_scale;
    tv.tv_sec = (time_t) s;
    tv.tv_usec = (suseconds_t) ((s - tv.tv_sec) * 1e6);
    evtimer_add(h->timer, &tv);

    h->next = srv->holds;
    srv->holds = h;
    srv->pd.prefill_legs++;

    return 0;
}


void
kvs_pd_reply_params(kvs_server_t *srv, kvs_seq_t *seq, const char *id,
    struct evbuffer *b)
{
    uint32_t     i;
    kvs_hold_t  *h, **prev;

    h = kvs_hold_find(srv, id, &prev);

    evbuffer_add_printf(b, ",\"kv_transfer_params\":{\"do_remote_prefill\":"
                        "true,\"do_remote_decode\":false,"
                        "\"remote_block_ids\":[");

    for (i = 0; h && i < h->nblocks; i++) {
        evbuffer_add_printf(b, "%s%u", i ? "," : "", h->blocks[i]);
    }

    evbuffer_add_printf(b, "],\"remote_engine_id\":\"kvsim-%s-%u\","
                        "\"remote_request_id\":\"%s\","
                        "\"remote_host\":\"127.0.0.1\",\"remote_port\":%u,"
                        "\"tp_size\":1}",
                        srv->id, srv->rank, id, srv->port);
}


static kvs_hold_t *
kvs_hold_find(kvs_server_t *srv, const char *id, kvs_hold_t ***prev)
{
    kvs_hold_t  **p;

    for (p = &srv->holds; *p; p = &(*p)->next) {
        if (strcmp((*p)->id, id) == 0) {
            *prev = p;
            return *p;
        }
    }

    return NULL;
}


static void
kvs_hold_release(kvs_hold_t *h, kvs_hold_t **prev)
{
    uint32_t  i;

    *prev = h->next;

    for (i = h->nblocks; i > 0; i--) {
        kvs_cache_release(&h->srv->cache, h->blocks[i - 1]);
    }

    event_free(h->timer);
    free(h);
}


static void
kvs_hold_expire(evutil_socket_t fd, short what, void *arg)
{
    kvs_hold_t     *h = arg, **prev;
    kvs_server_t   *srv = h->srv;

    if (kvs_hold_find(srv, h->id, &prev) != h) {
        return;
    }

    srv->pd.holds_expired++;

    if (!srv->sim->conf.quiet
        && (srv->pd.holds_expired & (srv->pd.holds_expired - 1)) == 0)
    {
        fprintf(stderr, "kvsim: %s: blocks held for \"%s\" never pulled in "
                "%g s: released (%llu so far)\n", srv->id, h->id,
                srv->sim->conf.kv_hold_s,
                (unsigned long long) srv->pd.holds_expired);
    }

    kvs_hold_release(h, prev);
}


/*
 * POST /kv/pull {"id": hold, "block_ids": [...]} (vLLM: the remote blocks
 * the decode lacks) or {"id": "room:N", "first_block": h} (SGLang: from
 * block h on) -> 200 {"block_ids": [...], "hashes": ["hex", ...]}, the
 * hold released; 404 no such hold (expired, pulled); 409 a room not ready
 * yet; 400 a block the hold does not have.  Any rank of the server, or
 * with any set (the --bootstrap-port) any server of the process.
 */
void
kvs_pd_pull_endpoint(kvs_server_t *srv, struct evhttp_request *req, int any)
{
    char              id[KVS_PD_ID_MAX + 32];
    long              first;
    size_t            k, n;
    json_t           *ids, *e;
    uint32_t          i, b, *want;
    unsigned          r, nranks;
    json_int_t        v;
    kvs_hold_t       *h, **prev;
    kvs_server_t     *rank, *from;
    struct evbuffer  *out;

    if (kvs_pull_read(req, id, sizeof(id), &ids, &first) != 0) {
        kvs_reply_error(srv, req, 400, "a pull wants an id and block_ids "
                        "or first_block");
        return;
    }

    /* the server's ranks; on the bootstrap port, every server's */
    h = NULL;
    rank = srv;
    from = any ? srv->sim->servers : srv - srv->rank;
    nranks = any ? srv->sim->nranks : srv->sim->conf.data_parallel;

    for (r = 0; h == NULL && r < nranks; r++) {
        rank = from + r;
        h = kvs_hold_find(rank, id, &prev);
    }

    if (h == NULL) {
        json_decref(ids);
        srv->pd.pulls_refused++;
        kvs_reply_error(srv, req, strncmp(id, "room:", 5) == 0 ? 409 : 404,
                        "no blocks held under this id");
        return;
    }

    n = ids ? json_array_size(ids)
            : (first < (long) h->nblocks ? (size_t) (h->nblocks - first)
                                         : 0);
    want = malloc((n + 1) * sizeof(uint32_t));
    out = evbuffer_new();

    if (want == NULL || out == NULL) {
        json_decref(ids);
        free(want);
        if (out) {
            evbuffer_free(out);
        }
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    for (k = 0; k < n; k++) {
        if (ids == NULL) {
            want[k] = h->blocks[first + k];
            continue;
        }

        e = json_array_get(ids, k);
        v = json_is_integer(e) ? json_integer_value(e) : -1;

        for (i = 0; i < h->nblocks && (json_int_t) h->blocks[i] != v; i++) {
            /* void */
        }

        if (i == h->nblocks) {
            break;
        }

        want[k] = h->blocks[i];
    }

    json_decref(ids);

    if (k < n) {
        free(want);
        evbuffer_free(out);
        srv->pd.pulls_refused++;
        kvs_reply_error(srv, req, 400, "a block this request does not hold");
        return;
    }

    evbuffer_add_printf(out, "{\"block_ids\":[");

    for (k = 0; k < n; k++) {
        evbuffer_add_printf(out, "%s%u", k ? "," : "", want[k]);
    }

    evbuffer_add_printf(out, "],\"hashes\":[");

    for (k = 0; k < n; k++) {
        b = want[k];
        evbuffer_add_printf(out, "%s\"%016llx\"", k ? "," : "",
                            (unsigned long long) rank->cache.blocks[b].hash);
    }

    evbuffer_add_printf(out, "]}");

    free(want);
    rank->pd.pulls_served++;
    rank->pd.blocks_served += n;
    kvs_hold_release(h, prev);

    kvs_reply(srv, req, 200, "application/json", out);
    evbuffer_free(out);
}


static int
kvs_pull_read(struct evhttp_request *req, char *id, size_t size,
    json_t **ids, long *first)
{
    json_t           *root, *v;
    size_t            len;
    const char       *body;
    json_error_t      err;
    struct evbuffer  *in;

    in = evhttp_request_get_input_buffer(req);
    len = evbuffer_get_length(in);
    body = (const char *) evbuffer_pullup(in, -1);
    *ids = NULL;
    *first = 0;

    root = body ? json_loadb(body, len, 0, &err) : NULL;
    if (root == NULL) {
        return -1;
    }

    if (kvs_pd_string(json_object_get(root, "id"), id, size) != 0) {
        json_decref(root);
        return -1;
    }

    v = json_object_get(root, "block_ids");

    if (json_is_array(v) && json_array_size(v) <= KVS_PD_BLOCKS_MAX) {
        *ids = json_incref(v);
        json_decref(root);
        return 0;
    }

    v = json_object_get(root, "first_block");

    if (json_is_integer(v) && json_integer_value(v) >= 0
        && json_integer_value(v) <= KVS_PD_BLOCKS_MAX)
    {
        *first = json_integer_value(v);
        json_decref(root);
        return 0;
    }

    json_decref(root);

    return -1;
}


/*
 * --bootstrap-port: one port for the whole process, as SGLang runs one
 * bootstrap server a prefill instance, so that a router can name the same
 * bootstrap_port for every server of a pool; POST /kv/pull there finds a
 * room held by any of the process's servers.
 */
int
kvs_pd_bootstrap_init(kvs_sim_t *sim)
{
    if (sim->conf.bootstrap_port == 0) {
        return 0;
    }

    sim->bootstrap = evhttp_new(sim->base);

    if (sim->bootstrap == NULL
        || evhttp_bind_socket_with_handle(sim->bootstrap, "127.0.0.1",
                                          sim->conf.bootstrap_port) == NULL)
    {
        fprintf(stderr, "kvsim: cannot listen on the bootstrap port %u\n",
                sim->conf.bootstrap_port);
        return -1;
    }

    evhttp_set_max_body_size(sim->bootstrap, KVS_BODY_MAX);
    evhttp_set_allowed_methods(sim->bootstrap,
                               EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(sim->bootstrap, kvs_pd_bootstrap_handler, sim);

    return 0;
}


static void
kvs_pd_bootstrap_handler(struct evhttp_request *req, void *arg)
{
    kvs_sim_t   *sim = arg;
    const char  *uri;

    uri = evhttp_request_get_uri(req);

    if (evhttp_request_get_command(req) == EVHTTP_REQ_POST
        && strncmp(uri, "/kv/pull", 8) == 0
        && (uri[8] == '\0' || uri[8] == '?'))
    {
        kvs_pd_pull_endpoint(&sim->servers[0], req, 1);
        return;
    }

    kvs_reply_error(&sim->servers[0], req, 404, "no such endpoint");
}


void
kvs_pd_free(kvs_server_t *srv)
{
    while (srv->holds) {
        kvs_hold_release(srv->holds, &srv->holds);
    }
}


void
kvs_pd_metrics(kvs_server_t *srv, struct evbuffer *b)
{
    char           eng[32];
    unsigned       r, n, held;
    kvs_hold_t    *h;
    kvs_server_t  *x, *first;

    n = srv->sim->conf.data_parallel;
    first = srv - srv->rank;

#define kvs_pd_metric(name, type, v)                                        \
    evbuffer_add_printf(b, "# TYPE kvsim_pd_" name " " type "\n");          \
    for (r = 0; r < n; r++) {                                               \
        x = &first[r];                                                      \
        if (n > 1) {                                                        \
            snprintf(eng, sizeof(eng), ",engine=\"%u\"", r);                \
        } else {                                                            \
            eng[0] = '\0';                                                  \
        }                                                                   \
        evbuffer_add_printf(b, "kvsim_pd_" name "{model_name=\"%s\",role=" \
                            "\"%s\"%s} %llu\n", srv->sim->conf.model,        \
                            kvs_role_name(srv->sim->conf.role), eng,          \
                            (unsigned long long) (v));                      \
    }

    kvs_pd_metric("prefill_legs_total", "counter", x->pd.prefill_legs);
    kvs_pd_metric("holds_expired_total", "counter", x->pd.holds_expired);
    kvs_pd_metric("pulls_served_total", "counter", x->pd.pulls_served);
    kvs_pd_metric("pulls_refused_total", "counter", x->pd.pulls_refused);
    kvs_pd_metric("blocks_served_total", "counter", x->pd.blocks_served);
    kvs_pd_metric("pulls_total", "counter", x->pd.pulls);
    kvs_pd_metric("pull_failures_total", "counter", x->pd.pull_failures);
    kvs_pd_metric("pull_timeouts_total", "counter", x->pd.pull_timeouts);
    kvs_pd_metric("blocks_pulled_total", "counter", x->pd.blocks_pulled);
    kvs_pd_metric("bytes_pulled_total", "counter", x->pd.bytes_pulled);
    kvs_pd_metric("fallbacks_total", "counter", x->pd.fallbacks);
    kvs_pd_metric("sidecar_legs_total", "counter", x->pd.sidecar_legs);
    kvs_pd_metric("bootstrap_retries_total", "counter",
                  x->pd.bootstrap_retries);

    for (held = 0, h = NULL, r = 0; r < n; r++) {
        for (h = first[r].holds; h; h = h->next) {
            held += h->nblocks;
        }
    }

    evbuffer_add_printf(b, "# TYPE kvsim_pd_blocks_held gauge\n"
                        "kvsim_pd_blocks_held{model_name=\"%s\",role=\"%s\"}"
                        " %u\n", srv->sim->conf.model,
                        kvs_role_name(srv->sim->conf.role), held);

#undef kvs_pd_metric
}


const char *
kvs_role_name(kvs_role_e role)
{
    return role == KVS_ROLE_PREFILL ? "prefill"
           : role == KVS_ROLE_DECODE ? "decode" : "both";
}
