/*
 * kv_aware core: chained XXH3-64 block hashes.
 */

#include <xxhash.h>

#include "kva_hash.h"


uint64_t
kva_hash_seed(uint64_t keyspace, const uint8_t *model, size_t model_len)
{
    return XXH3_64bits_withSeed(model, model_len, keyspace);
}


size_t
kva_hash_blocks(uint64_t seed, const uint8_t *data, size_t len,
    size_t block_size, uint64_t *out, size_t max_blocks)
{
    size_t          n, i, off, piece;
    uint64_t        h;
    const uint8_t  *block;

    if (block_size == 0) {
        return 0;
    }

    n = len / block_size;

    if (n > max_blocks) {
        n = max_blocks;
    }

    h = seed;

    for (i = 0; i < n; i++) {
        block = data + i * block_size;

        for (off = 0; off < block_size; off += piece) {
            piece = block_size - off < KVA_HASH_PIECE
                    ? block_size - off : KVA_HASH_PIECE;
            h = XXH3_64bits_withSeed(block + off, piece, h);
        }

        out[i] = h;
    }

    return n;
}


kva_prompt_rc_e
kva_hash_body(const uint8_t *body, size_t body_len, size_t block_size,
    uint8_t *scratch, uint64_t *hashes, size_t *nblocks, kva_prompt_t *p)
{
    uint64_t         seed;
    kva_prompt_rc_e  rc;

    *nblocks = 0;

    rc = kva_prompt_extract(body, body_len, scratch,
                            body_len + KVA_PROMPT_OUT_SLACK, p);

    if (rc != KVA_PROMPT_OK || hashes == NULL) {
        return rc;
    }

    seed = kva_hash_seed(KVA_KEYSPACE_TEXT, p->model, p->model_len);

    *nblocks = kva_hash_blocks(seed, p->out, p->out_len, block_size, hashes,
                               kva_hash_body_max(body_len, block_size));

    return KVA_PROMPT_OK;
}
