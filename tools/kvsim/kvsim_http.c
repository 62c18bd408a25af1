/*
 * kvsim: the OpenAI-compatible HTTP side of one server (evhttp).
 *
 * POST /v1/chat/completions, /v1/completions (streaming or not),
 * GET /v1/models, /health, /metrics.  A request becomes a sequence of the
 * server's scheduler; tokens go out as the steps produce them.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kva_hash.h"
#include "kva_prompt.h"
#include "kvsim_http.h"


#define KVS_MAX_TOKENS      (1u << 20)
#define KVS_DEFAULT_TOKENS  16
#define KVS_IDLE_TIMEOUT    300         /* s, per connection */


typedef struct kvs_req_s  kvs_req_t;


typedef struct {
    kvs_server_t               *srv;
    struct evhttp_connection   *evcon;
    kvs_req_t                  *req;    /* in flight */
    unsigned                    index;  /* in srv->http->conns */
} kvs_conn_t;


struct kvs_http_s {
    struct evhttp              *http;
    kvs_conn_t                **conns;
    unsigned                    nconns;
};


struct kvs_req_s {
    kvs_server_t               *srv;
    kvs_conn_t                 *conn;
    struct evhttp_request      *req;    /* NULL: the client is gone */
    kvs_seq_t                  *seq;
    struct event               *watch;  /* the client closing */
    uint64_t                    id;
    time_t                      created;
    unsigned                    chat:1;
    unsigned                    stream:1;
    unsigned                    started:1;
    char                        model[];    /* JSON-escaped */
};


static void kvs_http_handler(struct evhttp_request *req, void *arg);
static kvs_conn_t *kvs_conn_get(kvs_server_t *srv,
    struct evhttp_request *req);
static void kvs_conn_close(struct evhttp_connection *evcon, void *arg);
static void kvs_watch(kvs_req_t *r);
static void kvs_watch_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_completion(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat);
static void kvs_scan_options(const char *p, const char *end, int *stream,
    long *max_tokens);
static const char *kvs_skip_value(const char *p, const char *end);
static void kvs_req_done(kvs_req_t *r);
static void kvs_chunk(kvs_req_t *r, struct evbuffer *b, int done);
static void kvs_body(kvs_req_t *r, struct evbuffer *b);
static void kvs_head(struct evbuffer *b, kvs_req_t *r);
static void kvs_tail(struct evbuffer *b, kvs_req_t *r, int first, int done);
static void kvs_token(kvs_sim_t *sim, struct evbuffer *b);
static void kvs_metrics(kvs_server_t *srv, struct evhttp_request *req);
static void kvs_reply(kvs_server_t *srv, struct evhttp_request *req,
    int code, const char *type, struct evbuffer *body);
static void kvs_error(kvs_server_t *srv, struct evhttp_request *req,
    int code, const char *msg);
static void kvs_json_escape(char *dst, const uint8_t *src, size_t len);


int
kvs_http_init(kvs_server_t *srv)
{
    kvs_http_t  *h;

    h = calloc(1, sizeof(kvs_http_t));
    if (h == NULL) {
        return -1;
    }

    srv->http = h;
    h->conns = calloc(srv->sim->conf.max_conns, sizeof(kvs_conn_t *));
    h->http = evhttp_new(srv->sim->base);

    if (h->conns == NULL || h->http == NULL) {
        fprintf(stderr, "kvsim: %s: out of memory\n", srv->id);
        return -1;
    }

    evhttp_set_max_body_size(h->http, KVS_BODY_MAX);
    evhttp_set_max_headers_size(h->http, 64 * 1024);
    evhttp_set_timeout(h->http, KVS_IDLE_TIMEOUT);
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(h->http, kvs_http_handler, srv);

    if (evhttp_bind_socket_with_handle(h->http, "127.0.0.1", srv->port)
        == NULL)
    {
        fprintf(stderr, "kvsim: cannot listen on %s\n", srv->id);
        return -1;
    }

    return 0;
}


void
kvs_http_free(kvs_server_t *srv)
{
    kvs_http_t  *h = srv->http;

    if (h == NULL) {
        return;
    }

    /* closes connections: kvs_conn_close() frees them */
    if (h->http) {
        evhttp_free(h->http);
    }

    while (h->nconns) {
        kvs_conn_close(NULL, h->conns[h->nconns - 1]);
    }

    free(h->conns);
    free(h);
    srv->http = NULL;
}


void
kvs_http_seq_event(kvs_seq_t *seq, int done, void *arg)
{
    kvs_req_t        *r = seq->data;
    struct evbuffer  *b;

    if (r->req == NULL || seq->aborted || (!r->stream && !done)) {
        if (r->req && seq->aborted) {
            if (r->started) {
                evhttp_send_reply_end(r->req);

            } else {
                kvs_error(r->srv, r->req, 503, "shutting down");
            }
        }

        if (r->req == NULL || seq->aborted) {
            kvs_req_done(r);
        }

        return;
    }

    b = evbuffer_new();

    if (b == NULL) {
        if (done) {
            if (r->started) {
                evhttp_send_reply_end(r->req);

            } else {
                evhttp_send_error(r->req, 500, NULL);
            }

            kvs_req_done(r);
        }

        return;                         /* the client misses a token */
    }

    if (r->stream) {
        kvs_chunk(r, b, done);

    } else {
        kvs_body(r, b);
    }

    evbuffer_free(b);

    if (done) {
        kvs_req_done(r);
    }
}


static void
kvs_chunk(kvs_req_t *r, struct evbuffer *b, int done)
{
    int  first;

    first = (r->seq->out == 1);

    if (!r->started) {
        r->started = 1;
        evhttp_send_reply_start(r->req, 200, "OK");
    }

    evbuffer_add(b, "data: ", 6);
    kvs_head(b, r);

    if (r->chat) {
        evbuffer_add_printf(b, "\"delta\":{%s\"content\":\"",
                            first ? "\"role\":\"assistant\"," : "");
        kvs_token(r->srv->sim, b);
        evbuffer_add(b, "\"}", 2);

    } else {
        evbuffer_add(b, "\"text\":\"", 8);
        kvs_token(r->srv->sim, b);
        evbuffer_add_printf(b, "\",\"logprobs\":null");
    }

    kvs_tail(b, r, first, done);
    evbuffer_add_printf(b, "\n\n%s", done ? "data: [DONE]\n\n" : "");
    evhttp_send_reply_chunk(r->req, b);

    if (done) {
        evhttp_send_reply_end(r->req);
    }
}


static void
kvs_body(kvs_req_t *r, struct evbuffer *b)
{
    uint32_t  i;

    kvs_head(b, r);
    evbuffer_add_printf(b, r->chat ? "\"message\":{\"role\":\"assistant\","
                        "\"content\":\"" : "\"text\":\"");

    for (i = 0; i < r->seq->out; i++) {
        kvs_token(r->srv->sim, b);
    }

    evbuffer_add_printf(b, r->chat ? "\"}" : "\",\"logprobs\":null");
    kvs_tail(b, r, 1, 1);
    kvs_reply(r->srv, r->req, 200, "application/json", b);
}


static void
kvs_http_handler(struct evhttp_request *req, void *arg)
{
    kvs_server_t     *srv = arg;
    const char       *uri;
    size_t            n;
    kvs_conn_t       *conn;
    struct evbuffer  *b;

    srv->requests++;

    conn = kvs_conn_get(srv, req);
    if (conn == NULL) {
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Connection", "close");
        kvs_error(srv, req, 503, "too many connections");
        return;
    }

    uri = evhttp_request_get_uri(req);
    n = strcspn(uri, "?");

#define kvs_path(s)  (n == sizeof(s) - 1 && memcmp(uri, s, n) == 0)

    if (evhttp_request_get_command(req) == EVHTTP_REQ_POST) {
        if (kvs_path("/v1/chat/completions")) {
            kvs_completion(srv, conn, req, 1);

        } else if (kvs_path("/v1/completions")) {
            kvs_completion(srv, conn, req, 0);

        } else {
            kvs_error(srv, req, 404, "no such endpoint");
        }

        return;
    }

    if (kvs_path("/metrics")) {
        kvs_metrics(srv, req);
        return;
    }

    b = evbuffer_new();
    if (b == NULL) {
        kvs_error(srv, req, 500, "out of memory");
        return;
    }

    if (kvs_path("/health")) {
        kvs_reply(srv, req, 200, "application/json", b);

    } else if (kvs_path("/v1/models")) {
        evbuffer_add_printf(b, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\","
                            "\"object\":\"model\",\"created\":0,"
                            "\"owned_by\":\"kvsim\",\"max_model_len\":%u}]}",
                            srv->sim->conf.model,
                            srv->sim->conf.num_blocks
                            * srv->sim->conf.block_tokens);
        kvs_reply(srv, req, 200, "application/json", b);

    } else {
        kvs_error(srv, req, 404, "no such endpoint");
    }

#undef kvs_path

    evbuffer_free(b);
}


static kvs_conn_t *
kvs_conn_get(kvs_server_t *srv, struct evhttp_request *req)
{
    unsigned                   i;
    kvs_conn_t                *c;
    kvs_http_t                *h = srv->http;
    struct evhttp_connection  *evcon;

    evcon = evhttp_request_get_connection(req);

    for (i = 0; i < h->nconns; i++) {
        if (h->conns[i]->evcon == evcon) {
            return h->conns[i];
        }
    }

    if (h->nconns == srv->sim->conf.max_conns) {
        return NULL;
    }

    c = calloc(1, sizeof(kvs_conn_t));
    if (c == NULL) {
        return NULL;
    }

    c->srv = srv;
    c->evcon = evcon;
    c->index = h->nconns;
    h->conns[h->nconns++] = c;
    evhttp_connection_set_closecb(evcon, kvs_conn_close, c);

    return c;
}


static void
kvs_conn_close(struct evhttp_connection *evcon, void *arg)
{
    kvs_conn_t  *c = arg;
    kvs_http_t  *h = c->srv->http;
    kvs_req_t   *r = c->req;

    h->conns[c->index] = h->conns[--h->nconns];
    h->conns[c->index]->index = c->index;

    if (r) {
        r->conn = NULL;

        if (r->watch) {
            event_free(r->watch);
            r->watch = NULL;
        }

        /* a request cut off from its connection is ours to free */
        if (r->req && evhttp_request_get_connection(r->req) == NULL) {
            evhttp_request_free(r->req);
        }

        r->req = NULL;

        if (kvs_sched_abort(&r->srv->sched, r->seq)) {
            kvs_req_done(r);
        }
    }

    free(c);
}


static void
kvs_completion(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat)
{
    int               stream;
    long              max_tokens;
    char              msg[128];
    size_t            len, nh, bs, mlen;
    uint8_t          *body, *out;
    const uint8_t    *model;
    uint64_t         *hashes;
    kvs_req_t        *r;
    kvs_seq_t        *seq;
    kva_prompt_t      p;
    kvs_submit_e      rc;
    kva_prompt_rc_e   prc;
    struct evbuffer  *in;

    in = evhttp_request_get_input_buffer(req);
    len = evbuffer_get_length(in);
    body = evbuffer_pullup(in, -1);

    bs = 4 * (size_t) srv->sim->conf.block_tokens;
    nh = kva_hash_body_max(len, bs);

    out = malloc(len + KVA_PROMPT_OUT_SLACK);
    hashes = malloc((nh + 1) * sizeof(uint64_t));

    if ((body == NULL && len) || out == NULL || hashes == NULL) {
        free(out);
        free(hashes);
        kvs_error(srv, req, 503, "out of memory");
        return;
    }

    /* the module's own definition, so that our events match its lookups */
    prc = kva_hash_body(body, len, bs, out, hashes, &nh, &p);

    free(out);

    if (prc != KVA_PROMPT_OK) {
        free(hashes);
        snprintf(msg, sizeof(msg), "invalid request body: %s",
                 kva_prompt_strerror(prc));
        kvs_error(srv, req, 400, msg);
        return;
    }

    stream = 0;
    max_tokens = KVS_DEFAULT_TOKENS;
    kvs_scan_options((char *) body, (char *) body + len, &stream,
                     &max_tokens);

    if (max_tokens < 1 || max_tokens > KVS_MAX_TOKENS) {
        free(hashes);
        kvs_error(srv, req, 400, "max_tokens out of range");
        return;
    }

    if (p.model_len == 0) {
        model = (const uint8_t *) srv->sim->conf.model;
        mlen = strlen(srv->sim->conf.model);

    } else {
        model = p.model;
        mlen = p.model_len;
    }

    seq = kvs_seq_new((p.out_len + 3) / 4, max_tokens, hashes, nh);
    r = malloc(sizeof(kvs_req_t) + 6 * mlen + 1);

    free(hashes);

    if (seq == NULL || r == NULL) {
        free(r);
        kvs_seq_free(seq);
        kvs_error(srv, req, 503, "out of memory");
        return;
    }

    rc = kvs_sched_submit(&srv->sched, seq, kvs_now_ms());

    if (rc != KVS_SUBMIT_OK) {
        free(r);
        kvs_seq_free(seq);

        if (rc == KVS_SUBMIT_FULL) {
            kvs_error(srv, req, 503, "waiting queue full");

        } else {
            kvs_error(srv, req, 400, "maximum context length exceeded");
        }

        return;
    }

    r->srv = srv;
    r->conn = conn;
    r->req = req;
    r->seq = seq;
    r->id = ++srv->sim->req_ids;
    r->created = time(NULL);
    r->chat = chat;
    r->stream = stream;
    r->started = 0;

    kvs_json_escape(r->model, model, mlen);

    seq->data = r;
    conn->req = r;
    r->watch = NULL;
    kvs_watch(r);

    if (stream) {
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Content-Type", "text/event-stream");
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Cache-Control", "no-cache");
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "X-Kvsim-Server", srv->id);
    }

    kvs_server_kick(srv);
}


/* top-level "stream" and "max_tokens" of a body already validated */
static void
kvs_scan_options(const char *p, const char *end, int *stream,
    long *max_tokens)
{
    size_t       klen;
    const char  *key, *v;

#define kvs_ws(p)                                                           \
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) \
        p++
#define kvs_key(s) (klen == sizeof(s) - 1 && memcmp(key, s, klen) == 0)

    kvs_ws(p);

    if (p == end || *p++ != '{') {
        return;
    }

    for ( ;; ) {
        kvs_ws(p);

        if (p == end || *p != '"') {
            return;
        }

        key = p + 1;
        p = kvs_skip_value(p, end);
        klen = p - key - 1;

        kvs_ws(p);

        if (p == end || *p++ != ':') {
            return;
        }

        kvs_ws(p);
        v = p;
        p = kvs_skip_value(p, end);

        if (kvs_key("stream")) {
            *stream = (p - v == 4 && memcmp(v, "true", 4) == 0);

        } else if ((kvs_key("max_tokens")
                    || kvs_key("max_completion_tokens"))
                   && v < end && *v != 'n')
        {
            *max_tokens = (*v >= '0' && *v <= '9' && p - v < 9)
                          ? strtol(v, NULL, 10) : -1;
        }

        kvs_ws(p);

        if (p == end || *p++ != ',') {
            return;
        }
    }

#undef kvs_ws
#undef kvs_key
}


static const char *
kvs_skip_value(const char *p, const char *end)
{
    int  depth, in_str;

    depth = 0;
    in_str = 0;

    for ( /* void */ ; p < end; p++) {
        if (in_str) {
            if (*p == '\\') {
                p++;

            } else if (*p == '"') {
                in_str = 0;

                if (depth == 0) {
                    return p + 1;
                }
            }

            continue;
        }

        switch (*p) {
        case '"':
            in_str = 1;
            break;
        case '{':
        case '[':
            depth++;
            break;
        case '}':
        case ']':
            if (depth == 0) {
                return p;
            }

            if (--depth == 0) {
                return p + 1;
            }

            break;
        case ',':
        case ' ':
        case '\t':
        case '\r':
        case '\n':
            if (depth == 0) {
                return p;
            }
        }
    }

    return end;
}


/*
 * evhttp stops reading while a request waits for its reply, so a client
 * that gives up goes unnoticed until a write fails; vLLM aborts such
 * requests at once, and so do we.
 */
static void
kvs_watch(kvs_req_t *r)
{
    struct bufferevent  *bev;

    bev = evhttp_connection_get_bufferevent(r->conn->evcon);
    r->watch = event_new(r->srv->sim->base, bufferevent_getfd(bev), EV_READ,
                         kvs_watch_handler, r);

    if (r->watch) {
        event_add(r->watch, NULL);
    }
}


static void
kvs_watch_handler(evutil_socket_t fd, short what, void *arg)
{
    char        c;
    ssize_t     n;
    kvs_req_t  *r = arg;

    n = recv(fd, &c, 1, MSG_PEEK);

    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        event_add(r->watch, NULL);
        return;
    }

    if (n > 0) {
        return;                         /* a pipelined request: stop */
    }

    /* kvs_conn_close() aborts the sequence */
    evhttp_connection_free(r->conn->evcon);
}


static void
kvs_req_done(kvs_req_t *r)
{
    if (r->conn) {
        r->conn->req = NULL;
    }

    if (r->watch) {
        event_free(r->watch);
    }

    kvs_seq_free(r->seq);
    free(r);
}


static void
kvs_head(struct evbuffer *b, kvs_req_t *r)
{
    evbuffer_add_printf(b, "{\"id\":\"%s-kvsim-%llu\",\"object\":\"%s\","
                        "\"created\":%lld,\"model\":\"%s\",\"choices\":"
                        "[{\"index\":0,",
                        r->chat ? "chatcmpl" : "cmpl",
                        (unsigned long long) r->id,
                        r->chat ? (r->stream ? "chat.completion.chunk"
                                             : "chat.completion")
                                : "text_completion",
                        (long long) r->created, r->model);
}


static void
kvs_tail(struct evbuffer *b, kvs_req_t *r, int first, int done)
{
    kvs_seq_t  *seq = r->seq;

    evbuffer_add_printf(b, ",\"finish_reason\":%s}]",
                        done ? "\"length\"" : "null");

    if (done) {
        evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%u,"
                            "\"completion_tokens\":%u,\"total_tokens\":%u,"
                            "\"prompt_tokens_details\":"
                            "{\"cached_tokens\":%u}}",
                            seq->prompt, seq->out, seq->prompt + seq->out,
                            seq->cached);
    }

    if (first) {
        evbuffer_add_printf(b, ",\"kvsim\":{\"server\":\"%s\","
                            "\"cached_tokens\":%u,\"queue_ms\":%.3f,"
                            "\"preempted\":%u}",
                            r->srv->id, seq->cached,
                            seq->t_admitted - seq->t_arrival,
                            seq->preempted);
    }

    evbuffer_add(b, "}", 1);
}


static void
kvs_token(kvs_sim_t *sim, struct evbuffer *b)
{
    char  t[4];

    /* 4 bytes, no JSON escaping: the load generator's alphabet */
    t[0] = 'a' + (char) (kvs_random(sim) * 26);
    t[1] = 'a' + (char) (kvs_random(sim) * 26);
    t[2] = 'a' + (char) (kvs_random(sim) * 26);
    t[3] = ' ';

    evbuffer_add(b, t, 4);
}


static void
kvs_metrics(kvs_server_t *srv, struct evhttp_request *req)
{
    const char       *m;
    kvs_cache_t      *c = &srv->cache;
    kvs_sched_t      *s = &srv->sched;
    struct evbuffer  *b;

    b = evbuffer_new();
    if (b == NULL) {
        kvs_error(srv, req, 500, "out of memory");
        return;
    }

    m = srv->sim->conf.model;

#define kvs_metric(name, type, fmt, v)                                      \
    evbuffer_add_printf(b, "# TYPE " name " " type "\n"                     \
                        name "{model_name=\"%s\"} " fmt "\n", m, v)

    kvs_metric("vllm:num_requests_running", "gauge", "%u", s->nrunning);
    kvs_metric("vllm:num_requests_waiting", "gauge", "%u", s->nwaiting);
    kvs_metric("vllm:gpu_cache_usage_perc", "gauge", "%.6f",
               kvs_cache_usage(c));
    kvs_metric("vllm:kv_cache_usage_perc", "gauge", "%.6f",
               kvs_cache_usage(c));
    kvs_metric("vllm:prefix_cache_queries_total", "counter", "%llu",
               (unsigned long long) s->query_tokens);
    kvs_metric("vllm:prefix_cache_hits_total", "counter", "%llu",
               (unsigned long long) s->hit_tokens);
    kvs_metric("vllm:num_preemptions_total", "counter", "%llu",
               (unsigned long long) s->preemptions);
    kvs_metric("vllm:prompt_tokens_total", "counter", "%llu",
               (unsigned long long) s->prompt_tokens);
    kvs_metric("vllm:generation_tokens_total", "counter", "%llu",
               (unsigned long long) s->gen_tokens);
    kvs_metric("vllm:request_success_total", "counter", "%llu",
               (unsigned long long) s->finished);
    kvs_metric("kvsim_steps_total", "counter", "%llu",
               (unsigned long long) s->steps);
    kvs_metric("kvsim_step_lag_ms", "gauge", "%.3f", srv->lag_ms);
    kvs_metric("kvsim_cache_blocks_cached", "gauge", "%u", c->nhashed);
    kvs_metric("kvsim_cache_blocks_free", "gauge", "%u", c->nfree);
    kvs_metric("kvsim_cache_evictions_total", "counter", "%llu",
               (unsigned long long) c->evictions);
    kvs_metric("kvsim_events_published_total", "counter", "%llu",
               (unsigned long long) srv->published);
    kvs_metric("kvsim_events_dropped_total", "counter", "%llu",
               (unsigned long long) srv->dropped);
    kvs_metric("kvsim_event_seq", "gauge", "%llu",
               (unsigned long long) srv->seq);
    kvs_metric("kvsim_requests_total", "counter", "%llu",
               (unsigned long long) srv->requests);
    kvs_metric("kvsim_requests_rejected_total", "counter", "%llu",
               (unsigned long long) srv->rejected);

#undef kvs_metric

    kvs_reply(srv, req, 200, "text/plain; version=0.0.4", b);
    evbuffer_free(b);
}


static void
kvs_reply(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *type, struct evbuffer *body)
{
    struct evkeyvalq  *h;

    if (code >= 400) {
        srv->rejected++;
    }

    h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "X-Kvsim-Server", srv->id);
    evhttp_send_reply(req, code, NULL, body);
}


static void
kvs_error(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *msg)
{
    struct evbuffer  *b;

    b = evbuffer_new();
    if (b == NULL) {
        srv->rejected++;
        evhttp_send_error(req, code, NULL);
        return;
    }

    evbuffer_add_printf(b, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\","
                        "\"param\":null,\"code\":%d}}", msg,
                        code < 500 ? "invalid_request_error" : "server_error",
                        code);
    kvs_reply(srv, req, code, "application/json", b);
    evbuffer_free(b);
}


static void
kvs_json_escape(char *dst, const uint8_t *src, size_t len)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if (src[i] == '"' || src[i] == '\\') {
            *dst++ = '\\';
            *dst++ = src[i];

        } else if (src[i] < 0x20) {
            dst += sprintf(dst, "\\u%04x", src[i]);

        } else {
            *dst++ = src[i];
        }
    }

    *dst = '\0';
}
