/*
 * kvsim: POST /tokenize (kvsim_tokenize.h).
 */

#include <stdio.h>
#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "kvsim_reply.h"
#include "kvsim_token.h"
#include "kvsim_tokenize.h"


struct kvs_tok_s {
    kvs_server_t               *srv;
    struct evhttp_request      *req;
    kvs_tok_t                 **slot;
    struct event               *timer;
};


static void kvs_tokenize_answer(kvs_server_t *srv,
    struct evhttp_request *req);
static void kvs_tokenize_forget(kvs_tok_t *t);
static void kvs_tokenize_handler(evutil_socket_t fd, short what, void *arg);


void
kvs_tokenize(kvs_server_t *srv, struct evhttp_request *req,
    kvs_tok_t **slot)
{
    unsigned         ms;
    kvs_tok_t       *t;
    struct timeval   tv;

    ms = srv->sim->conf.tokenize_delay_ms;

    if (ms == 0) {
        kvs_tokenize_answer(srv, req);
        return;
    }

    t = calloc(1, sizeof(kvs_tok_t));
    if (t == NULL) {
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    t->timer = evtimer_new(srv->sim->base, kvs_tokenize_handler, t);
    if (t->timer == NULL) {
        free(t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    t->srv = srv;
    t->req = req;
    t->slot = slot;
    *slot = t;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    evtimer_add(t->timer, &tv);
}


void
kvs_tokenize_cancel(kvs_tok_t *t)
{
    /* a request cut off from its connection is ours to free */
    if (evhttp_request_get_connection(t->req) == NULL) {
        evhttp_request_free(t->req);
    }

    kvs_tokenize_forget(t);
}


static void
kvs_tokenize_forget(kvs_tok_t *t)
{
    *t->slot = NULL;
    event_free(t->timer);
    free(t);
}


static void
kvs_tokenize_handler(evutil_socket_t fd, short what, void *arg)
{
    kvs_tok_t              *t = arg;
    kvs_server_t           *srv;
    struct evhttp_request  *req;

    srv = t->srv;
    req = t->req;
    kvs_tokenize_forget(t);

    kvs_tokenize_answer(srv, req);
}


/* {"count": n, "max_model_len": M, "tokens": [ids]}, as vLLM answers */
static void
kvs_tokenize_answer(kvs_server_t *srv, struct evhttp_request *req)
{
    char              msg[128];
    size_t            i, len;
    uint8_t          *body;
    kvs_conf_t       *conf = &srv->sim->conf;
    kvs_tokens_t      t;
    kva_prompt_rc_e   rc;
    struct evbuffer  *in, *b;

    if (conf->tokenize_fail) {
        kvs_reply_error(srv, req, 500, "tokenizer failed (--tokenize-fail)");
        return;
    }

    in = evhttp_request_get_input_buffer(req);
    len = evbuffer_get_length(in);
    body = evbuffer_pullup(in, -1);

    if (body == NULL && len) {
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    rc = kvs_tokens_body(body, len, &t);

    if (t.nomem) {
        kvs_tokens_free(&t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    if (rc != KVA_PROMPT_OK) {
        kvs_tokens_free(&t);
        snprintf(msg, sizeof(msg), "invalid request body: %s",
                 kva_prompt_strerror(rc));
        kvs_reply_error(srv, req, 400, msg);
        return;
    }

    b = evbuffer_new();
    if (b == NULL) {
        kvs_tokens_free(&t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return;
    }

    evbuffer_add_printf(b, "{\"count\":%zu,\"max_model_len\":%llu,"
                        "\"tokens\":[", t.n,
                        (unsigned long long) conf->num_blocks
                        * conf->block_tokens);

    for (i = 0; i < t.n; i++) {
        evbuffer_add_printf(b, i ? ",%u" : "%u", t.ids[i]);
    }

    evbuffer_add(b, "]}", 2);
    kvs_tokens_free(&t);

    kvs_reply(srv, req, 200, "application/json", b);
    evbuffer_free(b);
}
