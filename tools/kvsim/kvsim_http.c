/*
 * kvsim: the OpenAI-compatible HTTP side of one server (evhttp).
 *
 * POST /v1/chat/completions, /v1/completions (streaming or not),
 * /tokenize, GET /v1/models, /health, /metrics.  Here: the listener,
 * routing, the connections and a request's life on them; kvsim_request.c
 * turns a body into a sequence of the server's scheduler, kvsim_reply.c
 * writes the tokens as the steps produce them, kvsim_tokenize.c answers
 * /tokenize.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvsim_http.h"
#include "kvsim_pd.h"
#include "kvsim_pull.h"
#include "kvsim_reply.h"
#include "kvsim_request.h"
#include "kvsim_server.h"
#include "kvsim_tokenize.h"


#define KVS_IDLE_TIMEOUT    300         /* s, per connection */


struct kvs_conn_s {
    kvs_server_t               *srv;
    struct evhttp_connection   *evcon;
    kvs_req_t                  *req;    /* in flight */
    kvs_tok_t                  *tok;    /* a /tokenize reply waiting */
    unsigned                    index;  /* in srv->http->conns */
};


struct kvs_http_s {
    struct evhttp              *http;
    kvs_conn_t                **conns;
    unsigned                    nconns;
};


static void kvs_http_handler(struct evhttp_request *req, void *arg);
static kvs_conn_t *kvs_conn_get(kvs_server_t *srv,
    struct evhttp_request *req);
static void kvs_conn_close(struct evhttp_connection *evcon, void *arg);
static void kvs_watch(kvs_req_t *r);
static void kvs_watch_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_completion(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat);
static void kvs_req_done(kvs_req_t *r);
static kvs_server_t *kvs_rank_of(kvs_server_t *srv,
    struct evhttp_request *req);


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

    if (r->pull) {
        kvs_pull_admitted(r);           /* its pulled blocks are its own */
    }

    if (done && r->hold && r->req && !seq->aborted) {
        /* a leg 1: its blocks wait for the decode's pull */
        (void) kvs_pd_hold(r->srv, seq, r->pd->hold_id);
    }

    if (r->req == NULL || seq->aborted || (!r->stream && !done)) {
        if (r->req && seq->aborted) {
            if (r->started) {
                evhttp_send_reply_end(r->req);

            } else {
                kvs_reply_error(r->srv, r->req, 503, "shutting down");
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
        kvs_reply_chunk(r, b, done);

    } else {
        kvs_reply_body(r, b);
    }

    evbuffer_free(b);

    if (done) {
        kvs_req_done(r);
    }
}


static void
kvs_http_handler(struct evhttp_request *req, void *arg)
{
    kvs_server_t     *srv = arg, *rank;
    const char       *uri;
    size_t            n;
    kvs_conn_t       *conn;
    struct evbuffer  *b;

    uri = evhttp_request_get_uri(req);
    n = strcspn(uri, "?");

#define kvs_path(s)  (n == sizeof(s) - 1 && memcmp(uri, s, n) == 0)

    /* a completion runs on a rank (data parallelism), and counts there */
    rank = srv;

    if (evhttp_request_get_command(req) == EVHTTP_REQ_POST
        && (kvs_path("/v1/chat/completions") || kvs_path("/v1/completions")))
    {
        rank = kvs_rank_of(srv, req);
    }

    rank->requests++;

    conn = kvs_conn_get(srv, req);
    if (conn == NULL) {
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Connection", "close");
        kvs_reply_error(srv, req, 503, "too many connections");
        return;
    }

    if (evhttp_request_get_command(req) == EVHTTP_REQ_POST) {
        if (kvs_path("/v1/chat/completions")) {
            kvs_completion(rank, conn, req, 1);

        } else if (kvs_path("/v1/completions")) {
            kvs_completion(rank, conn, req, 0);

        } else if (kvs_path("/tokenize")) {
            kvs_tokenize(srv, req, &conn->tok);

        } else if (kvs_path("/kv/pull")) {
            kvs_pd_pull_endpoint(srv, req, 0);

        } else {
            kvs_reply_error(srv, req, 404, "no such endpoint");
        }

        return;
    }

    if (kvs_path("/metrics")) {
        kvs_reply_metrics(srv, req);
        return;
    }

    b = evbuffer_new();
    if (b == NULL) {
        kvs_reply_error(srv, req, 500, "out of memory");
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
        kvs_reply_error(srv, req, 404, "no such endpoint");
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

    if (c->tok) {
        kvs_tokenize_cancel(c->tok);
    }

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

        if (r->pending || kvs_sched_abort(&r->srv->sched, r->seq)) {
            kvs_req_done(r);
        }
    }

    free(c);
}


static void
kvs_completion(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat)
{
    kvs_req_t  *r;

    r = kvs_request_create(srv, conn, req, chat);
    if (r == NULL) {
        return;
    }

    conn->req = r;
    kvs_watch(r);

    if (r->pending) {
        kvs_pull_start(r);              /* submits it when its blocks are in */
        return;
    }

    kvs_server_kick(srv);
}


void
kvs_http_fail(kvs_req_t *r, int code, const char *msg)
{
    if (r->req) {
        kvs_reply_error(r->srv, r->req, code, msg);
    }

    kvs_req_done(r);
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


/* the request's rank, by vLLM's header (data parallelism) */

static kvs_server_t *
kvs_rank_of(kvs_server_t *srv, struct evhttp_request *req)
{
    return kvs_server_rank(srv,
                           evhttp_find_header(
                               evhttp_request_get_input_headers(req),
                               "X-data-parallel-rank"));
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

    kvs_pull_cancel(r);
    kvs_pd_params_free(r->pd);
    kvs_seq_free(r->seq);
    free(r);
}
