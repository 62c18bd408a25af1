/*
 * kv_aware core: canonical prompt bytes -> chained block hashes.
 *
 * h[-1] = XXH3_64(model, seed = key space); h[i] = XXH3_64(block i, h[i-1]).
 * Only full blocks count, so each hash stands for the whole prefix before it.
 */

#ifndef _KVA_HASH_H_INCLUDED_
#define _KVA_HASH_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


/* key spaces never share hashes: a later token-id key space gets its own */
#define KVA_KEYSPACE_TEXT   0x6b76612d74657874ULL   /* "kva-text" */


uint64_t kva_hash_seed(uint64_t keyspace, const uint8_t *model,
    size_t model_len);

/*
 * Writes at most max_blocks hashes of the full blocks of data into out and
 * returns how many it wrote.
 */
size_t kva_hash_blocks(uint64_t seed, const uint8_t *data, size_t len,
    size_t block_size, uint64_t *out, size_t max_blocks);


#endif /* _KVA_HASH_H_INCLUDED_ */
