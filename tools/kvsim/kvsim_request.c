/*
 * kvsim: a completion request.  The body is hashed by the module's own
 * function, so that the blocks our events announce are the ones the
 * module looks up; "stream" and "max_tokens" are picked out of it by a
 * scan that needs no JSON parser.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "kva_hash.h"
#include "kva_prompt.h"
#include "kvsim_reply.h"
#include "kvsim_request.h"


#define KVS_MAX_TOKENS      (1u << 20)
#define KVS_DEFAULT_TOKENS  16


static void kvs_scan_options(const char *p, const char *end, int *stream,
    long *max_tokens);
static const char *kvs_skip_value(const char *p, const char *end);
static void kvs_json_escape(char *dst, const uint8_t *src, size_t len);


kvs_req_t *
kvs_request_create(kvs_server_t *srv, kvs_conn_t *conn,
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
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    /* the module's own definition, so that our events match its lookups */
    prc = kva_hash_body(body, len, bs, out, hashes, &nh, &p);

    free(out);

    if (prc != KVA_PROMPT_OK) {
        free(hashes);
        snprintf(msg, sizeof(msg), "invalid request body: %s",
                 kva_prompt_strerror(prc));
        kvs_reply_error(srv, req, 400, msg);
        return NULL;
    }

    stream = 0;
    max_tokens = KVS_DEFAULT_TOKENS;
    kvs_scan_options((char *) body, (char *) body + len, &stream,
                     &max_tokens);

    if (max_tokens < 1 || max_tokens > KVS_MAX_TOKENS) {
        free(hashes);
        kvs_reply_error(srv, req, 400, "max_tokens out of range");
        return NULL;
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
        kvs_reply_error(srv, req, 503, "out of memory");
        return NULL;
    }

    rc = kvs_sched_submit(&srv->sched, seq, kvs_now_ms());

    if (rc != KVS_SUBMIT_OK) {
        free(r);
        kvs_seq_free(seq);

        if (rc == KVS_SUBMIT_FULL) {
            kvs_reply_error(srv, req, 503, "waiting queue full");

        } else {
            kvs_reply_error(srv, req, 400, "maximum context length exceeded");
        }

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
    r->watch = NULL;

    kvs_json_escape(r->model, model, mlen);

    seq->data = r;

    return r;
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
