/*
 * kvsim: token ids of a request (kvsim_token.h).
 */

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "kvsim_token.h"


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
    size_t            cap;
    uint8_t          *scratch;
    kva_prompt_rc_e   rc;

    memset(t, 0, sizeof(kvs_tokens_t));

    scratch = malloc(kva_token_body_scratch(len));
    if (scratch == NULL) {
        t->nomem = 1;
        return KVA_PROMPT_EMPTY;
    }

    /* kept for the keys: a cache_salt is decoded there */
    t->tb.scratch = scratch;

    rc = kva_token_body(body, len, scratch, &t->tb);

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    /* the body's ids, or a token per 4 bytes of the canonical text */
    cap = t->tb.from_body ? t->tb.nids : (t->tb.p.out_len + 3) / 4;

    t->ids = malloc((cap + 1) * sizeof(uint32_t));
    if (t->ids == NULL) {
        t->nomem = 1;
        return KVA_PROMPT_EMPTY;
    }

    if (t->tb.from_body) {
        memcpy(t->ids, t->tb.ids, cap * sizeof(uint32_t));
        t->n = cap;
        t->from_body = 1;

    } else {
        t->n = kvs_tokenize_text(t->tb.p.out, t->tb.p.out_len, t->ids);
    }

    return KVA_PROMPT_OK;
}


size_t
kvs_tokens_keys(kvs_tokens_t *t, const char *model, size_t block_tokens,
    uint64_t **keys)
{
    size_t  max;

    t->tb.block_tokens = block_tokens;
    t->tb.block_size = 4 * block_tokens;
    t->tb.model = (const uint8_t *) model;
    t->tb.model_len = strlen(model);

    max = kva_token_body_max(&t->tb, t->ids, t->n);

    *keys = malloc((max + 1) * sizeof(uint64_t));
    if (*keys == NULL) {
        return 0;
    }

    return kva_token_body_keys(&t->tb, *keys, max);
}


void
kvs_tokens_free(kvs_tokens_t *t)
{
    free(t->ids);
    free(t->tb.scratch);
    t->ids = NULL;
    t->n = 0;
    t->tb.scratch = NULL;
}
