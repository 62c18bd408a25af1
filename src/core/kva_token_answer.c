/*
 * kv_aware core: the schema of a tokenizer's answer (kva_token_answer.h).
 */

#include <string.h>

#include "kva_json_walk.h"
#include "kva_token_answer.h"


#define KVA_ANSWER_KEY_TOKENS  1


/* where the ids go */
typedef struct {
    uint32_t         *ids;
    size_t            max;
    size_t            n;
    unsigned          found;
} kva_answer_t;


static int kva_answer_item(kva_json_walk_t *w, unsigned key, void *ctx);
static int kva_answer_id(kva_json_walk_t *w, unsigned key, void *ctx);


static const kva_json_key_t  kva_answer_keys[] = {
    { "tokens", 6, KVA_ANSWER_KEY_TOKENS },
    { "token_ids", 9, KVA_ANSWER_KEY_TOKENS },
    { "prompt_token_ids", 16, KVA_ANSWER_KEY_TOKENS }
};


kva_prompt_rc_e
kva_prompt_token_answer(const uint8_t *body, size_t len, uint32_t *ids,
    size_t max, size_t *n)
{
    kva_answer_t     a;
    kva_json_walk_t  w;

    *n = 0;

    if (len == 0) {
        return KVA_PROMPT_EMPTY;
    }

    memset(&w, 0, sizeof(kva_json_walk_t));

    w.lx.pos = body;
    w.lx.end = body + len;
    w.lx.rc = KVA_PROMPT_OK;
    w.keys = kva_answer_keys;
    w.nkeys = sizeof(kva_answer_keys) / sizeof(kva_answer_keys[0]);

    a.ids = ids;
    a.max = max;
    a.n = 0;
    a.found = 0;

    if (kva_json_walk_body(&w, "{[", kva_answer_item, &a) != 0) {
        return w.lx.rc;
    }

    if (!a.found) {
        return KVA_PROMPT_NO_PROMPT;
    }

    *n = (a.n < max) ? a.n : max;

    return KVA_PROMPT_OK;
}


/* any value of an answer: the ids' array is looked for at every depth */

static int
kva_answer_item(kva_json_walk_t *w, unsigned key, void *ctx)
{
    kva_answer_t  *a;

    a = ctx;

    if (key == KVA_ANSWER_KEY_TOKENS && !a->found && *w->lx.pos == '[') {
        a->n = 0;

        /* a->found goes back to 0 on an element that is not an id */
        a->found = 1;

        if (kva_json_walk(w, kva_answer_id, a) != 0) {
            return -1;
        }

        if (!a->found) {
            a->n = 0;
        }

        return 0;
    }

    if (*w->lx.pos == '{' || *w->lx.pos == '[') {
        return kva_json_walk(w, kva_answer_item, a);
    }

    return kva_json_skip(w);
}


static int
kva_answer_id(kva_json_walk_t *w, unsigned key, void *ctx)
{
    uint32_t       token;
    unsigned       is_token;
    kva_answer_t  *a;

    a = ctx;

    if (*w->lx.pos != '-' && !kva_is_digit(*w->lx.pos)) {
        a->found = 0;
        return kva_json_skip(w);
    }

    if (kva_json_number(&w->lx, &token, &is_token) != 0) {
        return -1;
    }

    if (!is_token) {
        a->found = 0;

    } else if (a->found && a->n < a->max) {
        a->ids[a->n++] = token;

    } else if (a->found) {
        /* past max: a prefix is all routing needs, counted for *n only */
        a->n++;
    }

    return 0;
}
