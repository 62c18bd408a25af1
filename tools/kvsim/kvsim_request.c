/*
 * kvsim: a completion request.  The body is keyed by the module's own
 * functions (kva_keys.h), so that the blocks our events announce are the
 * ones the module looks up; "stream" and "max_tokens" are read with
 * jansson once the keys' scan has validated the body.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>

#include "kva_keys.h"
#include "kvsim_http.h"
#include "kvsim_reply.h"
#include "kvsim_request.h"
#include "kvsim_server.h"
#include "kvsim_token.h"
#include "kvsim_vllm.h"


#define KVS_MAX_TOKENS      (1u << 20)
#define KVS_DEFAULT_TOKENS  16


static kvs_seq_t *kvs_seq_text(kvs_server_t *srv,
    struct evhttp_request *req, const uint8_t *body, size_t len,
    kva_prompt_t *p);
static kvs_seq_t *kvs_seq_tokens(kvs_server_t *srv,
    struct evhttp_request *req, const uint8_t *body, size_t len,
    kva_prompt_t *p);
static uint32_t kvs_lora_index(const kvs_conf_t *conf, const char *name,
    size_t len);
static void kvs_scan_options(const uint8_t *body, size_t len, int *stream,
    long *max_tokens, kvs_pd_params_t *pd);
static int kvs_request_role(kvs_req_t *r, kvs_pd_params_t *pd);
static void kvs_request_admitted(kvs_req_t *r);
static void kvs_json_escape(char *dst, const uint8_t *src, size_t len);


kvs_req_t *
kvs_request_create(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat)
{
    int               stream;
    long              max_tokens;
    size_t            len, mlen;
    uint8_t          *body;
    const uint8_t    *model;
    kvs_req_t        *r;
    kvs_seq_t        *seq;
    kva_prompt_t      p;
    kvs_submit_e      rc;
    kvs_pd_params_t   pd;
    struct evbuffer  *in;

    in = evhttp_request_get_input_buffer(req);
    len = evbuffer_get_length(in);
    body = evbuffer_pullup(in, -1);

    if (body == NULL && len) {
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    seq = srv->sim->conf.tokens ? kvs_seq_tokens(srv, req, body, len, &p)
                                : kvs_seq_text(srv, req, body, len, &p);
    if (seq == NULL) {
        return NULL;
    }

    stream = 0;
    max_tokens = KVS_DEFAULT_TOKENS;
    memset(&pd, 0, sizeof(kvs_pd_params_t));
    kvs_scan_options(body, len, &stream, &max_tokens, &pd);
    kvs_pd_params_headers(srv, req, &pd);

    if (max_tokens < 1 || max_tokens > KVS_MAX_TOKENS) {
        free(pd.block_ids);
        kvs_seq_free(seq);
        kvs_reply_error(srv, req, 400, "max_tokens out of range");
        return NULL;
    }

    seq->max_out = max_tokens;

    if (p.model_len == 0) {
        model = (const uint8_t *) srv->sim->conf.model;
        mlen = strlen(srv->sim->conf.model);

    } else {
        model = p.model;
        mlen = p.model_len;
    }

    r = malloc(sizeof(kvs_req_t) + 6 * mlen + 1);

    if (r == NULL) {
        free(pd.block_ids);
        kvs_seq_free(seq);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
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
    r->pending = 0;
    r->hold = 0;
    r->pd = NULL;
    r->pull = NULL;
    r->watch = NULL;

    kvs_json_escape(r->model, model, mlen);

    seq->data = r;

    if (kvs_request_role(r, &pd) != 0) {
        free(pd.block_ids);
        free(r);
        kvs_seq_free(seq);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    if (r->pending) {
        return r;                       /* kvsim_pull.c submits it */
    }

    rc = kvs_sched_submit(&srv->sched, seq, kvs_now_ms());

    if (rc != KVS_SUBMIT_OK) {
        kvs_pd_params_free(r->pd);
        free(r);
        kvs_seq_free(seq);

        if (rc == KVS_SUBMIT_FULL) {
            kvs_reply_error(srv, req, 503, "waiting queue full");

        } else {
            kvs_reply_error(srv, req, 400, "maximum context length exceeded");
        }

        return NULL;
    }

    kvs_request_admitted(r);

    return r;
}


/*
 * --early-headers: vLLM and SGLang answer through Starlette's
 * StreamingResponse, and uvicorn writes the headers before the first
 * chunk exists, so a proxy's header time is not their time to first token
 */
static void
kvs_request_admitted(kvs_req_t *r)
{
    if (r->stream && r->req != NULL && r->srv->sim->conf.early_headers) {
        kvs_reply_start(r);
    }
}


/*
 * What the request is to this server's --role: a leg 1 (vLLM's params
 * asking for a remote decode, or SGLang's room on a prefill server) holds
 * its blocks when done and answers one token, never streamed; a leg 2
 * (vLLM's params, SGLang's room, llm-d's header on a sidecar) waits for
 * its pull; anything else is served aggregated, as today.
 */
static int
kvs_request_role(kvs_req_t *r, kvs_pd_params_t *pd)
{
    kvs_role_e  role = r->srv->sim->conf.role;

    if (pd->remote_decode && role != KVS_ROLE_DECODE) {
        if (pd->request_id[0]) {
            snprintf(pd->hold_id, sizeof(pd->hold_id), "%s",
                     pd->request_id);

        } else {
            snprintf(pd->hold_id, sizeof(pd->hold_id), "kvsim-%u-%llu",
                     r->srv->port, (unsigned long long) r->id);
        }

        r->hold = 1;

    } else if (pd->bootstrap && role == KVS_ROLE_PREFILL) {
        snprintf(pd->hold_id, sizeof(pd->hold_id), "room:%llu",
                 (unsigned long long) pd->room);
        r->hold = 1;

    } else if (role != KVS_ROLE_PREFILL
               && (pd->remote_prefill || pd->bootstrap || pd->sidecar))
    {
        r->pending = 1;

    } else {
        if (pd->bad && role != KVS_ROLE_PREFILL) {
            r->srv->pd.fallbacks++;     /* half a handshake: aggregated */
        }

        free(pd->block_ids);
        return 0;
    }

    if (r->hold) {
        r->seq->max_out = 1;
        r->stream = 0;
    }

    r->pd = malloc(sizeof(kvs_pd_params_t));
    if (r->pd == NULL) {
        return -1;
    }

    memcpy(r->pd, pd, sizeof(kvs_pd_params_t));

    return 0;
}


int
kvs_request_submit(kvs_req_t *r)
{
    kvs_submit_e  rc;

    r->pending = 0;
    rc = kvs_sched_submit(&r->srv->sched, r->seq, kvs_now_ms());

    if (rc == KVS_SUBMIT_OK) {
        kvs_request_admitted(r);
        kvs_server_kick(r->srv);
        return 0;
    }

    kvs_http_fail(r, rc == KVS_SUBMIT_FULL ? 503 : 400,
                  rc == KVS_SUBMIT_FULL ? "waiting queue full"
                                        : "maximum context length exceeded");
    return -1;
}


/* text: the prompt's blocks hashed as the module hashes the body */
static kvs_seq_t *
kvs_seq_text(kvs_server_t *srv, struct evhttp_request *req,
    const uint8_t *body, size_t len, kva_prompt_t *p)
{
    char              msg[128];
    size_t            nh, bs;
    uint8_t          *out;
    uint64_t         *hashes;
    kvs_seq_t        *seq;
    kva_prompt_rc_e   prc;

    bs = 4 * (size_t) srv->sim->conf.block_tokens;
    nh = kva_hash_body_max(len, bs);

    out = malloc(len + KVA_PROMPT_OUT_SLACK);
    hashes = malloc((nh + 1) * sizeof(uint64_t));

    if (out == NULL || hashes == NULL) {
        free(out);
        free(hashes);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    /* the module's own definition, so that our events match its lookups */
    prc = kva_hash_body(body, len, bs, out, hashes, &nh, p);

    free(out);

    if (prc != KVA_PROMPT_OK) {
        free(hashes);
        snprintf(msg, sizeof(msg), "invalid request body: %s",
                 kva_prompt_strerror(prc));
        kvs_reply_error(srv, req, 400, msg);
        return NULL;
    }

    seq = kvs_seq_new((p->out_len + 3) / 4, KVS_DEFAULT_TOKENS, hashes, nh);

    free(hashes);

    if (seq == NULL) {
        kvs_reply_error(srv, req, 503, "out of memory");
    }

    return seq;
}


/*
 * tokens: the prompt's ids (the body's, or the pseudo-tokenizer's) keyed
 * by the core's token key space, seeded by the request's model, which is
 * an adapter's name for an adapter; with --events zmq the sequence also
 * carries what an engine publishes: the ids and its own chained hashes.
 */
static kvs_seq_t *
kvs_seq_tokens(kvs_server_t *srv, struct evhttp_request *req,
    const uint8_t *body, size_t len, kva_prompt_t *p)
{
    char              msg[128];
    size_t            nh, b, mlen, bt;
    uint32_t          lora;
    uint64_t          salt, prev;
    uint64_t         *hashes;
    const char       *model;
    kvs_seq_t        *seq;
    kvs_tokens_t      t;
    kvs_conf_t       *conf = &srv->sim->conf;
    kva_prompt_rc_e   prc;

    prc = kvs_tokens_body(body, len, &t);

    if (t.nomem) {
        kvs_tokens_free(&t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    if (prc != KVA_PROMPT_OK) {
        kvs_tokens_free(&t);
        snprintf(msg, sizeof(msg), "invalid request body: %s",
                 kva_prompt_strerror(prc));
        kvs_reply_error(srv, req, 400, msg);
        return NULL;
    }

    *p = t.tb.p;
    p->out = NULL;
    bt = conf->block_tokens;

    if (p->model_len) {
        model = (const char *) p->model;
        mlen = p->model_len;

    } else {
        model = conf->model;
        mlen = strlen(model);
    }

    lora = kvs_lora_index(conf, model, mlen);

    /* the module's own keys, so that our events match its lookups */
    nh = kvs_tokens_keys(&t, conf->model, bt, &hashes);
    if (hashes == NULL) {
        kvs_tokens_free(&t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    seq = kvs_seq_new(t.n, KVS_DEFAULT_TOKENS, hashes, nh);

    free(hashes);

    if (seq == NULL) {
        kvs_tokens_free(&t);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    if (conf->events != KVS_EVENTS_ZMQ) {
        kvs_tokens_free(&t);
        return seq;
    }

    seq->ehashes = malloc((nh + 1) * sizeof(uint64_t));
    if (seq->ehashes == NULL) {
        kvs_tokens_free(&t);
        kvs_seq_free(seq);
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    salt = kvs_vllm_salt(model, mlen);
    prev = srv->sim->engine_seed;

    for (b = 0; b < nh; b++) {
        prev = kvs_vllm_hash(prev, salt, &t.ids[b * bt], bt);
        seq->ehashes[b] = prev;
    }

    /* the sequence owns the ids now */
    seq->ids = t.ids;
    seq->lora = lora;
    t.ids = NULL;
    kvs_tokens_free(&t);

    return seq;
}


static uint32_t
kvs_lora_index(const kvs_conf_t *conf, const char *name, size_t len)
{
    unsigned  i;

    for (i = 0; i < conf->nlora; i++) {
        if (strlen(conf->lora[i]) == len
            && memcmp(conf->lora[i], name, len) == 0)
        {
            return i + 1;
        }
    }

    return 0;
}


/*
 * Top-level "stream" and "max_tokens" (or "max_completion_tokens") of a
 * body the scan has validated: the last one given wins, null leaves the
 * default, any other value that is not a count of tokens is refused; and
 * what it asks of disaggregation (kvsim_pd.c).
 */
static void
kvs_scan_options(const uint8_t *body, size_t len, int *stream,
    long *max_tokens, kvs_pd_params_t *pd)
{
    double         d;
    json_t        *root, *v;
    const char    *key;
    json_error_t   err;

    root = json_loadb((const char *) body, len, JSON_ALLOW_NUL, &err);

    if (root == NULL) {
        /* out of memory, or a number past jansson's range: the defaults */
        return;
    }

    json_object_foreach(root, key, v) {

        if (strcmp(key, "stream") == 0) {
            *stream = json_is_true(v);

        } else if ((strcmp(key, "max_tokens") == 0
                    || strcmp(key, "max_completion_tokens") == 0)
                   && !json_is_null(v))
        {
            /* out of range: refused by the caller, as a string is */
            d = json_is_number(v) ? json_number_value(v) : -1;
            *max_tokens = (d >= 0 && d <= KVS_MAX_TOKENS) ? (long) d : -1;
        }
    }

    /* disaggregation's members: out of memory, none of them */
    if (kvs_pd_params(root, pd) != 0) {
        free(pd->block_ids);
        memset(pd, 0, sizeof(kvs_pd_params_t));
    }

    json_decref(root);
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
