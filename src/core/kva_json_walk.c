/*
 * kv_aware core: a JSON value walked member by member (kva_json_walk.h).
 */

#include <string.h>

#include "kva_json_walk.h"


static unsigned kva_json_key_id(kva_json_walk_t *w, const uint8_t *key,
    size_t len);
static int kva_json_next(kva_json_walk_t *w, unsigned *key, size_t *n);
static int kva_json_skip_item(kva_json_walk_t *w, unsigned key, void *ctx);


static unsigned
kva_json_key_id(kva_json_walk_t *w, const uint8_t *key, size_t len)
{
    size_t  i;

    for (i = 0; i < w->nkeys; i++) {
        if (w->keys[i].len == len
            && memcmp(w->keys[i].name, key, len) == 0)
        {
            return w->keys[i].id;
        }
    }

    return KVA_JSON_KEY_OTHER;
}


/*
 * Steps to the next member (key != NULL) or element of a container:
 * returns 1 with w->lx.pos at its value, which is not at the end of the
 * body, 0 after the closing bracket, -1 on error.  A ']' right after a
 * comma is left to fail as a value.
 */

static int
kva_json_next(kva_json_walk_t *w, unsigned *key, size_t *n)
{
    uint8_t     buf[KVA_JSON_KEY_MAX];
    kva_sink_t  sink;

    kva_json_skip_ws(&w->lx);

    if (w->lx.pos == w->lx.end) {
        return kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
    }

    if (*w->lx.pos == (key ? '}' : ']')) {
        w->lx.pos++;
        return 0;
    }

    if (*n > 0) {
        if (*w->lx.pos != ',') {
            return kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
        }

        w->lx.pos++;
        kva_json_skip_ws(&w->lx);
    }

    (*n)++;

    if (key == NULL) {
        return (w->lx.pos < w->lx.end)
               ? 1 : kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
    }

    if (w->lx.pos == w->lx.end || *w->lx.pos != '"') {
        return kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
    }

    sink.buf = buf;
    sink.len = 0;
    sink.cap = KVA_JSON_KEY_MAX;
    sink.hs = NULL;

    if (kva_json_string(&w->lx, &sink) != 0) {
        return -1;
    }

    *key = (sink.len <= KVA_JSON_KEY_MAX) ? kva_json_key_id(w, buf, sink.len)
                                          : KVA_JSON_KEY_OTHER;

    kva_json_skip_ws(&w->lx);

    if (w->lx.pos == w->lx.end || *w->lx.pos != ':') {
        return kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
    }

    w->lx.pos++;
    kva_json_skip_ws(&w->lx);

    return (w->lx.pos < w->lx.end)
           ? 1 : kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
}


int
kva_json_walk(kva_json_walk_t *w, kva_json_item_pt item, void *ctx)
{
    int        rc;
    size_t     n;
    unsigned   key, *keyp;

    if (++w->depth > KVA_PROMPT_MAX_DEPTH) {
        return kva_json_fail(&w->lx, KVA_PROMPT_TOO_DEEP);
    }

    key = KVA_JSON_KEY_OTHER;
    keyp = (*w->lx.pos == '{') ? &key : NULL;
    w->lx.pos++;
    n = 0;

    while ((rc = kva_json_next(w, keyp, &n)) == 1) {
        if (item(w, key, ctx) != 0) {
            return -1;
        }
    }

    w->depth--;

    return rc;
}


int
kva_json_skip(kva_json_walk_t *w)
{
    uint32_t    token;
    unsigned    is_token;
    kva_sink_t  none;

    if (w->lx.pos == w->lx.end) {
        return kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
    }

    switch (*w->lx.pos) {

    case '{':
    case '[':
        return kva_json_walk(w, kva_json_skip_item, NULL);

    case '"':
        none.buf = NULL;
        none.len = 0;
        none.cap = 0;
        none.hs = NULL;
        return kva_json_string(&w->lx, &none);

    case 't':
        return kva_json_literal(&w->lx, "true", 4);

    case 'f':
        return kva_json_literal(&w->lx, "false", 5);

    case 'n':
        return kva_json_literal(&w->lx, "null", 4);

    default:
        return kva_json_number(&w->lx, &token, &is_token);
    }
}


static int
kva_json_skip_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    return kva_json_skip(w);
}


int
kva_json_walk_body(kva_json_walk_t *w, const char *opens,
    kva_json_item_pt item, void *ctx)
{
    int  rc;

    kva_json_skip_ws(&w->lx);

    if (w->lx.pos < w->lx.end && strchr(opens, *w->lx.pos) != NULL
        && *w->lx.pos != '\0')
    {
        rc = kva_json_walk(w, item, ctx);

    } else {
        rc = kva_json_skip(w);
    }

    if (rc == 0) {
        kva_json_skip_ws(&w->lx);

        if (w->lx.pos != w->lx.end) {
            rc = kva_json_fail(&w->lx, KVA_PROMPT_NOT_JSON);
        }
    }

    return rc;
}
