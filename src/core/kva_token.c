/*
 * kv_aware core: the token key space (kva_token.h).
 */

#include <string.h>

#include <xxhash.h>

#include "kva_hash.h"
#include "kva_token.h"


/* ids a piece holds: a piece is KVA_HASH_PIECE bytes, as in text */
#define KVA_TOKEN_PIECE_IDS  (KVA_HASH_PIECE / 4)


const char  *const kva_tokenize_names[] = {
    KVA_TOKENIZE_RESULTS(KVA_LIST_NAME)
};


uint64_t
kva_token_seed(const uint8_t *model, size_t model_len)
{
    return kva_hash_seed(KVA_KEYSPACE_TOKENS, model, model_len);
}


size_t
kva_token_blocks(uint64_t seed, const uint32_t *ids, size_t n,
    size_t block_tokens, const uint64_t *extra, uint64_t *out,
    size_t max_blocks)
{
    size_t    b, nblocks, i, k, take;
    uint8_t   piece[KVA_HASH_PIECE];
    uint32_t  v;
    uint64_t  h;

    if (block_tokens == 0) {
        return 0;
    }

    nblocks = n / block_tokens;
    nblocks = (nblocks < max_blocks) ? nblocks : max_blocks;
    h = seed;

    for (b = 0; b < nblocks; b++) {

        if (extra != NULL) {
            h ^= extra[b];
        }

        /*
         * the bytes are written out rather than hashed in place: the key
         * must be the same on a big-endian machine
         */

        for (i = 0; i < block_tokens; i += take) {
            take = block_tokens - i;
            take = (take < KVA_TOKEN_PIECE_IDS) ? take : KVA_TOKEN_PIECE_IDS;

            for (k = 0; k < take; k++) {
                v = ids[b * block_tokens + i + k];
                piece[4 * k] = (uint8_t) v;
                piece[4 * k + 1] = (uint8_t) (v >> 8);
                piece[4 * k + 2] = (uint8_t) (v >> 16);
                piece[4 * k + 3] = (uint8_t) (v >> 24);
            }

            h = XXH3_64bits_withSeed(piece, 4 * take, h);
        }

        out[b] = h;
    }

    return nblocks;
}


uint64_t
kva_token_extra(const uint8_t *bytes, size_t len)
{
    return XXH3_64bits_withSeed(bytes, len, KVA_TOKEN_EXTRA_SEED);
}


uint64_t
kva_token_salt(const uint8_t *salt, size_t len, uint8_t *scratch)
{
    uint8_t  *p;

    p = scratch;
    *p++ = 0x91;

    /* msgpack's shortest str header, as msgpack-c writes it */
    if (len < 32) {
        *p++ = (uint8_t) (0xa0 | len);

    } else if (len < 0x100) {
        *p++ = 0xd9;
        *p++ = (uint8_t) len;

    } else if (len < 0x10000) {
        *p++ = 0xda;
        *p++ = (uint8_t) (len >> 8);
        *p++ = (uint8_t) len;

    } else {
        *p++ = 0xdb;
        *p++ = (uint8_t) (len >> 24);
        *p++ = (uint8_t) (len >> 16);
        *p++ = (uint8_t) (len >> 8);
        *p++ = (uint8_t) len;
    }

    if (len) {
        memcpy(p, salt, len);
    }

    return kva_token_extra(scratch, (size_t) (p - scratch) + len);
}
