/*
 * kv_aware core: a request body -> its block keys (kva_keys.h).
 */

#include <string.h>

#include "kva_hash.h"
#include "kva_keys.h"
#include "kva_prompt.h"
#include "kva_token.h"


kva_prompt_rc_e
kva_hash_body(const uint8_t *body, size_t body_len, size_t block_size,
    uint8_t *scratch, uint64_t *hashes, size_t *nblocks, kva_prompt_t *p)
{
    kva_prompt_rc_e    rc;
    kva_hash_stream_t  hs;

    *nblocks = 0;

    kva_hash_stream_init(&hs, block_size, hashes,
                         hashes ? kva_hash_body_max(body_len, block_size)
                                : 0);

    rc = kva_prompt_hash(body, body_len, scratch,
                         scratch ? body_len + KVA_PROMPT_OUT_SLACK : 0,
                         &hs, p);

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    *nblocks = kva_hash_stream_end(&hs, p->model, p->model_len);

    return KVA_PROMPT_OK;
}


kva_prompt_rc_e
kva_hash_body2(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen,
    size_t block_size, uint8_t *scratch, uint64_t *hashes, size_t *nblocks,
    kva_prompt_t *p)
{
    size_t             k;
    kva_prompt_rc_e    rc;
    kva_hash_stream_t  hs;

    *nblocks = 0;

    kva_hash_stream_init(&hs, block_size, hashes,
                         hashes ? kva_hash_body_max(alen + blen, block_size)
                                : 0);

    /* the window: all of a, and as much of b as the lexer looks ahead */
    k = (blen < KVA_HASH_SEAM) ? blen : KVA_HASH_SEAM;

    memcpy(scratch, a, alen);
    memcpy(scratch + alen, b, k);

    if (k == blen) {
        rc = kva_prompt_hash(scratch, alen + blen, NULL, 0, &hs, p);
        p->salt = NULL;
        p->salt_len = 0;

    } else {
        rc = kva_prompt_hash_split(scratch, alen + k, alen, b, blen, &hs, p);
    }

    if (rc != KVA_PROMPT_OK) {
        return rc;
    }

    *nblocks = kva_hash_stream_end(&hs, p->model, p->model_len);

    return KVA_PROMPT_OK;
}


kva_prompt_rc_e
kva_token_body(const uint8_t *body, size_t len, uint8_t *scratch,
    kva_token_body_t *tb)
{
    size_t            i, n;
    uint32_t         *ids;
    kva_prompt_rc_e   rc;

    tb->scratch = scratch;
    tb->ids = NULL;
    tb->nids = 0;
    tb->from_body = 0;

    rc = kva_prompt_extract(body, len, scratch, kva_token_body_scratch(len),
                            &tb->p);

    if (rc != KVA_PROMPT_OK || !tb->p.token_ids || tb->p.truncated) {
        return rc;
    }

    /* the ids were written as 4 bytes little-endian: turned in place */
    ids = (uint32_t *) scratch;
    n = tb->p.nids;

    for (i = 0; i < n; i++) {
        ids[i] = (uint32_t) scratch[4 * i]
                 | (uint32_t) scratch[4 * i + 1] << 8
                 | (uint32_t) scratch[4 * i + 2] << 16
                 | (uint32_t) scratch[4 * i + 3] << 24;
    }

    tb->ids = ids;
    tb->nids = n;
    tb->from_body = 1;

    return KVA_PROMPT_OK;
}


size_t
kva_token_body_max(kva_token_body_t *tb, const uint32_t *ids, size_t n)
{
    if (tb->ids == NULL && ids != NULL) {
        tb->ids = ids;
        tb->nids = n;
    }

    if (tb->ids == NULL) {
        return tb->p.out_len / tb->block_size;
    }

    return tb->nids / tb->block_tokens;
}


size_t
kva_token_body_keys(kva_token_body_t *tb, uint64_t *out, size_t max)
{
    size_t          slen;
    uint8_t        *salt;
    uint64_t        seed;
    kva_prompt_t   *p;

    p = &tb->p;

    if (tb->ids == NULL) {
        return kva_hash_text(p->model, p->model_len, p->out, p->out_len,
                             tb->block_size, out, max);
    }

    seed = (p->model_len == 0 && tb->model_len != 0)
           ? kva_token_seed(tb->model, tb->model_len)
           : kva_token_seed(p->model, p->model_len);

    if (p->salt) {
        /*
         * Decoded behind the body's ids, or over the canonical text that
         * a tokenizer's ids replace: the body holds both the ids (2 bytes
         * or more for 4 out) and the quoted salt, so 2 * len + the slack
         * is room for the ids, the salt and its msgpack copy.
         */
        salt = tb->scratch + (tb->from_body ? 4 * tb->nids : 0);
        slen = kva_prompt_salt(p->salt, p->salt_len, salt);
        seed ^= kva_token_salt(salt, slen, salt + p->salt_len);
    }

    return kva_token_blocks(seed, tb->ids, tb->nids, tb->block_tokens, NULL,
                            out, max);
}
