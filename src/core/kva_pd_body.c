/*
 * kv_aware core: the bodies of a disaggregated request (kva_pd_body.h).
 */

#include <stdio.h>
#include <string.h>

#include "kva_json_walk.h"
#include "kva_pd_body.h"


/* the top-level keys a rewrite replaces, as bits */
#define KVA_PD_KEY_STREAM           1
#define KVA_PD_KEY_STREAM_OPTIONS   2
#define KVA_PD_KEY_MAX_TOKENS       3
#define KVA_PD_KEY_MAX_COMPLETION   4
#define KVA_PD_KEY_MIN_TOKENS       5
#define KVA_PD_KEY_PARAMS           6
#define KVA_PD_KEY_BOOT_HOST        7
#define KVA_PD_KEY_BOOT_PORT        8
#define KVA_PD_KEY_BOOT_ROOM        9

#define KVA_PD_BOOTSTRAP                                                      \
    (kva_pd_bit(KVA_PD_KEY_BOOT_HOST) | kva_pd_bit(KVA_PD_KEY_BOOT_PORT)      \
     | kva_pd_bit(KVA_PD_KEY_BOOT_ROOM))

#define kva_pd_bit(key)             (1u << (key))


/* a rewrite under way */
typedef struct {
    const uint8_t     *from;        /* where the next member's text starts */
    uint8_t           *out;
    size_t             n;           /* bytes written */
    unsigned           members;     /* members written */
    unsigned           drop;        /* the keys left out, as bits */
    unsigned           seen;        /* and those the body had */

    /* kva_pd_answer_params(): the params' value */
    const uint8_t     *params;
    size_t             params_len;
} kva_pd_rewrite_t;


static kva_prompt_rc_e kva_pd_rewrite(const uint8_t *body, size_t len,
    unsigned drop, kva_pd_rewrite_t *rw);
static int kva_pd_member(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_pd_answer_member(kva_json_walk_t *w, unsigned key, void *ctx);
static void kva_pd_add(kva_pd_rewrite_t *rw, const char *text, size_t len);
static size_t kva_pd_bootstrap(const uint8_t *host, size_t host_len,
    unsigned port, uint64_t room, uint8_t *out);


static const kva_json_key_t  kva_pd_keys[] = {
    { "stream", 6, KVA_PD_KEY_STREAM },
    { "stream_options", 14, KVA_PD_KEY_STREAM_OPTIONS },
    { "max_tokens", 10, KVA_PD_KEY_MAX_TOKENS },
    { "max_completion_tokens", 21, KVA_PD_KEY_MAX_COMPLETION },
    { "min_tokens", 10, KVA_PD_KEY_MIN_TOKENS },
    { "kv_transfer_params", 18, KVA_PD_KEY_PARAMS },
    { "bootstrap_host", 14, KVA_PD_KEY_BOOT_HOST },
    { "bootstrap_port", 14, KVA_PD_KEY_BOOT_PORT },
    { "bootstrap_room", 14, KVA_PD_KEY_BOOT_ROOM }
};


kva_prompt_rc_e
kva_pd_prefill_body(const uint8_t *body, size_t len, uint8_t *out,
    size_t *out_len)
{
    kva_prompt_rc_e   rc;
    kva_pd_rewrite_t  rw;

    memset(&rw, 0, sizeof(kva_pd_rewrite_t));
    rw.out = out;

    rc = kva_pd_rewrite(body, len,
                        kva_pd_bit(KVA_PD_KEY_STREAM)
                        | kva_pd_bit(KVA_PD_KEY_STREAM_OPTIONS)
                        | kva_pd_bit(KVA_PD_KEY_MAX_TOKENS)
                        | kva_pd_bit(KVA_PD_KEY_MAX_COMPLETION)
                        | kva_pd_bit(KVA_PD_KEY_MIN_TOKENS)
                        | kva_pd_bit(KVA_PD_KEY_PARAMS), &rw);

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    kva_pd_add(&rw, "\"stream\":false", sizeof("\"stream\":false") - 1);
    kva_pd_add(&rw, "\"max_tokens\":1", sizeof("\"max_tokens\":1") - 1);

    if (rw.seen & kva_pd_bit(KVA_PD_KEY_MAX_COMPLETION)) {
        kva_pd_add(&rw, "\"max_completion_tokens\":1",
                   sizeof("\"max_completion_tokens\":1") - 1);
    }

    kva_pd_add(&rw, KVA_PD_PREFILL_PARAMS,
               sizeof(KVA_PD_PREFILL_PARAMS) - 1);

    out[rw.n++] = '}';
    *out_len = rw.n;

    return KVA_PROMPT_OK;
}


kva_prompt_rc_e
kva_pd_decode_body(const uint8_t *body, size_t len, const uint8_t *params,
    size_t params_len, uint8_t *out, size_t *out_len)
{
    kva_prompt_rc_e   rc;
    kva_pd_rewrite_t  rw;

    memset(&rw, 0, sizeof(kva_pd_rewrite_t));
    rw.out = out;

    rc = kva_pd_rewrite(body, len, kva_pd_bit(KVA_PD_KEY_PARAMS), &rw);

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    if (rw.seen & kva_pd_bit(KVA_PD_KEY_PARAMS)) {
        kva_pd_add(&rw, "\"kv_transfer_params\":",
                   sizeof("\"kv_transfer_params\":") - 1);

        /* kva_pd_add() put the comma before the key: the value follows */
        memcpy(out + rw.n, params, params_len);
        rw.n += params_len;

        out[rw.n++] = '}';
        *out_len = rw.n;

        return KVA_PROMPT_OK;
    }

    /*
     * The client sent none (the usual case): its body byte for byte, the
     * params first in the object
     */
    while (*body != '{') {
        body++;
        len--;
    }

    rw.n = 0;
    rw.out[rw.n++] = '{';
    memcpy(out + rw.n, "\"kv_transfer_params\":",
           sizeof("\"kv_transfer_params\":") - 1);
    rw.n += sizeof("\"kv_transfer_params\":") - 1;
    memcpy(out + rw.n, params, params_len);
    rw.n += params_len;

    if (rw.members) {
        out[rw.n++] = ',';
    }

    memcpy(out + rw.n, body + 1, len - 1);
    rw.n += len - 1;

    *out_len = rw.n;

    return KVA_PROMPT_OK;
}


kva_prompt_rc_e
kva_pd_sglang_body(const uint8_t *body, size_t len, const uint8_t *host,
    size_t host_len, unsigned port, uint64_t room, uint8_t *out,
    size_t *out_len)
{
    size_t            i, n;
    uint8_t           c, fields[KVA_PD_SGLANG_EXTRA];
    kva_prompt_rc_e   rc;
    kva_pd_rewrite_t  rw;

    /* the host goes into a JSON string unescaped: only what needs none */
    if (host_len == 0 || host_len > KVA_PD_HOST_MAX || port == 0
        || port > 65535)
    {
        return KVA_PROMPT_NOT_JSON;
    }

    for (i = 0; i < host_len; i++) {
        c = host[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ':'))
        {
            return KVA_PROMPT_NOT_JSON;
        }
    }

    n = kva_pd_bootstrap(host, host_len, port, room, fields);

    memset(&rw, 0, sizeof(kva_pd_rewrite_t));
    rw.out = out;

    /* the whole body checked first, whichever way it is written */
    rc = kva_pd_rewrite(body, len, KVA_PD_BOOTSTRAP, &rw);

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    if (rw.seen & KVA_PD_BOOTSTRAP) {
        kva_pd_add(&rw, (const char *) fields, n);

        out[rw.n++] = '}';
        *out_len = rw.n;

        return KVA_PROMPT_OK;
    }

    /* none of the client's (the usual case): its bytes after the fields */
    while (*body != '{') {
        body++;
        len--;
    }

    rw.n = 0;
    out[rw.n++] = '{';
    memcpy(out + rw.n, fields, n);
    rw.n += n;

    if (rw.members) {
        out[rw.n++] = ',';
    }

    memcpy(out + rw.n, body + 1, len - 1);
    rw.n += len - 1;

    *out_len = rw.n;

    return KVA_PROMPT_OK;
}


/* the three members, without braces; the host checked by the caller */
static size_t
kva_pd_bootstrap(const uint8_t *host, size_t host_len, unsigned port,
    uint64_t room, uint8_t *out)
{
    size_t  n;

    n = sizeof("\"bootstrap_host\":\"") - 1;
    memcpy(out, "\"bootstrap_host\":\"", n);
    memcpy(out + n, host, host_len);
    n += host_len;

    n += (size_t) snprintf((char *) out + n, KVA_PD_SGLANG_EXTRA - n,
                           "\",\"bootstrap_port\":%u,\"bootstrap_room\":%llu",
                           port, (unsigned long long) room);

    return n;
}


kva_prompt_rc_e
kva_pd_answer_params(const uint8_t *answer, size_t len,
    const uint8_t **params, size_t *params_len)
{
    kva_json_walk_t   w;
    kva_pd_rewrite_t  rw;

    memset(&w, 0, sizeof(kva_json_walk_t));
    memset(&rw, 0, sizeof(kva_pd_rewrite_t));

    if (len == 0) {
        return KVA_PROMPT_EMPTY;
    }

    w.lx.pos = answer;
    w.lx.end = answer + len;
    w.lx.rc = KVA_PROMPT_OK;
    w.keys = kva_pd_keys;
    w.nkeys = sizeof(kva_pd_keys) / sizeof(kva_pd_keys[0]);

    if (kva_json_walk_body(&w, "{", kva_pd_answer_member, &rw) != 0) {
        return w.lx.rc;
    }

    if (rw.params == NULL) {
        return KVA_PROMPT_NO_PROMPT;
    }

    *params = rw.params;
    *params_len = rw.params_len;

    return KVA_PROMPT_OK;
}


/* the last one wins, as in the engine's parser */
static int
kva_pd_answer_member(kva_json_walk_t *w, unsigned key, void *ctx)
{
    const uint8_t     *start;
    kva_pd_rewrite_t  *rw;

    rw = ctx;
    start = w->lx.pos;

    if (kva_json_skip(w) != 0) {
        return -1;
    }

    if (key == KVA_PD_KEY_PARAMS && w->depth == 1) {
        if (*start == '{') {
            rw->params = start;
            rw->params_len = (size_t) (w->lx.pos - start);

        } else {
            rw->params = NULL;
        }
    }

    return 0;
}


/* '{', the members kept, with rw->out left open for what is added */
static kva_prompt_rc_e
kva_pd_rewrite(const uint8_t *body, size_t len, unsigned drop,
    kva_pd_rewrite_t *rw)
{
    kva_json_walk_t  w;

    if (len == 0) {
        return KVA_PROMPT_EMPTY;
    }

    memset(&w, 0, sizeof(kva_json_walk_t));

    w.lx.pos = body;
    w.lx.end = body + len;
    w.lx.rc = KVA_PROMPT_OK;
    w.keys = kva_pd_keys;
    w.nkeys = sizeof(kva_pd_keys) / sizeof(kva_pd_keys[0]);

    kva_json_skip_ws(&w.lx);

    if (w.lx.pos == w.lx.end || *w.lx.pos != '{') {
        return KVA_PROMPT_NOT_JSON;
    }

    rw->from = w.lx.pos + 1;
    rw->drop = drop;
    rw->out[rw->n++] = '{';

    if (kva_json_walk_body(&w, "{", kva_pd_member, rw) != 0) {
        return w.lx.rc;
    }

    return KVA_PROMPT_OK;
}


/*
 * A top-level member, w->lx.pos at its value: its text runs from past the
 * previous one's value (and the comma between) to past its own value.
 */
static int
kva_pd_member(kva_json_walk_t *w, unsigned key, void *ctx)
{
    const uint8_t     *start;
    kva_pd_rewrite_t  *rw;

    rw = ctx;
    start = rw->from;

    while (*start == ' ' || *start == '\t' || *start == '\n'
           || *start == '\r' || *start == ',')
    {
        start++;
    }

    if (kva_json_skip(w) != 0) {
        return -1;
    }

    rw->from = w->lx.pos;

    if (key != KVA_JSON_KEY_OTHER) {
        rw->seen |= kva_pd_bit(key);

        if (rw->drop & kva_pd_bit(key)) {
            return 0;
        }
    }

    if (rw->members++) {
        rw->out[rw->n++] = ',';
    }

    memcpy(rw->out + rw->n, start, (size_t) (w->lx.pos - start));
    rw->n += (size_t) (w->lx.pos - start);

    return 0;
}


static void
kva_pd_add(kva_pd_rewrite_t *rw, const char *text, size_t len)
{
    if (rw->members++) {
        rw->out[rw->n++] = ',';
    }

    memcpy(rw->out + rw->n, text, len);
    rw->n += len;
}
