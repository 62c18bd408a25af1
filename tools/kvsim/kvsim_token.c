/*
 * kvsim: token ids of a request (kvsim_token.h).
 */

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "kvsim_token.h"


#define kvs_ws(p, end)                                                      \
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) \
        p++


static const char *kvs_prompt_value(const char *p, const char *end);
static long kvs_int_array(const char *p, const char *end, uint32_t *ids,
    size_t cap);


size_t
kvs_tokenize_text(const uint8_t *text, size_t len, uint32_t *ids)
{
    size_t  i, n, take;

    n = 0;

    for (i = 0; i < len; i += take) {
        take = (len - i < 4) ? len - i : 4;
        ids[n++] = (uint32_t) (XXH3_64bits(text + i, take) % KVS_VOCAB);
    }

    return n;
}


kva_prompt_rc_e
kvs_tokens_body(const uint8_t *body, size_t len, kvs_tokens_t *t)
{
    long              n;
    size_t            cap;
    uint8_t          *out;
    const char       *v;
    kva_prompt_rc_e   rc;

    memset(t, 0, sizeof(kvs_tokens_t));

    out = malloc(len + KVA_PROMPT_OUT_SLACK);
    if (out == NULL) {
        t->nomem = 1;
        return KVA_PROMPT_EMPTY;
    }

    rc = kva_prompt_extract(body, len, out, len + KVA_PROMPT_OUT_SLACK,
                            &t->p);
    t->p.out = NULL;

    if (rc != KVA_PROMPT_OK) {
        free(out);
        return rc;
    }

    /* a token per 4 bytes of the canonical text, at most */
    cap = (t->p.out_len + 3) / 4;
    t->ids = malloc((cap + 1) * sizeof(uint32_t));
    if (t->ids == NULL) {
        free(out);
        t->nomem = 1;
        return KVA_PROMPT_EMPTY;
    }

    n = -1;

    if (t->p.kind == KVA_PROMPT_KIND_PROMPT) {
        v = kvs_prompt_value((const char *) body, (const char *) body + len);

        if (v != NULL) {
            n = kvs_int_array(v, (const char *) body + len, t->ids, cap);
        }
    }

    if (n >= 0) {
        t->n = n;
        t->from_body = 1;

    } else {
        t->n = kvs_tokenize_text(out, t->p.out_len, t->ids);
    }

    free(out);

    return KVA_PROMPT_OK;
}


void
kvs_tokens_free(kvs_tokens_t *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = 0;
}


const char *
kvs_json_skip(const char *p, const char *end)
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


/* the first top-level "prompt" value of a body already validated */
static const char *
kvs_prompt_value(const char *p, const char *end)
{
    size_t       klen;
    const char  *key, *v;

    kvs_ws(p, end);

    if (p == end || *p++ != '{') {
        return NULL;
    }

    for ( ;; ) {
        kvs_ws(p, end);

        if (p == end || *p != '"') {
            return NULL;
        }

        key = p + 1;
        p = kvs_json_skip(p, end);
        klen = p - key - 1;

        kvs_ws(p, end);

        if (p == end || *p++ != ':') {
            return NULL;
        }

        kvs_ws(p, end);
        v = p;

        if (klen == 6 && memcmp(key, "prompt", 6) == 0) {
            return v;
        }

        p = kvs_json_skip(p, end);

        kvs_ws(p, end);

        if (p == end || *p++ != ',') {
            return NULL;
        }
    }
}


/*
 * A flat array of integers in [0, 2^32): their count, or -1 for anything
 * else (text, nested lists, a fraction), which the pseudo-tokenizer takes.
 * The canonical form holds 4 bytes per id, so cap is room enough for a
 * list of ids only.
 */
static long
kvs_int_array(const char *p, const char *end, uint32_t *ids, size_t cap)
{
    long      n;
    uint64_t  v;

    if (p == end || *p++ != '[') {
        return -1;
    }

    n = 0;
    kvs_ws(p, end);

    if (p < end && *p == ']') {
        return 0;
    }

    for ( ;; ) {
        kvs_ws(p, end);

        if (p == end || *p < '0' || *p > '9') {
            return -1;
        }

        for (v = 0; p < end && *p >= '0' && *p <= '9'; p++) {
            v = v * 10 + (*p - '0');

            if (v > 0xffffffffu) {
                return -1;
            }
        }

        if ((size_t) n == cap) {
            return -1;
        }

        ids[n++] = (uint32_t) v;

        kvs_ws(p, end);

        if (p == end) {
            return -1;
        }

        if (*p == ']') {
            return n;
        }

        if (*p++ != ',') {
            return -1;
        }
    }
}
