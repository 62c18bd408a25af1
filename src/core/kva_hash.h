/*
 * kv_aware core: canonical prompt bytes -> chained block hashes.
 *
 * h[-1] = XXH3_64(model, seed = key space).  Block i is hashed as a chain
 * of pieces of at most KVA_HASH_PIECE bytes, the first seeded with h[i-1],
 * each next one with the hash of the one before; the last is h[i].  Only
 * full blocks count, so each hash stands for the whole prefix before it.
 */

#ifndef _KVA_HASH_H_INCLUDED_
#define _KVA_HASH_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_prompt.h"


/* key spaces never share hashes: a later token-id key space gets its own */
#define KVA_KEYSPACE_TEXT   0x6b76612d74657874ULL   /* "kva-text" */

/*
 * XXH3 derives a 192-byte secret from the seed on every call over 240
 * bytes, which costs more than hashing 256 bytes; up to 128 bytes it uses
 * the seed directly.  Pieces of 128 bytes hash a 256-byte block in 18 ns
 * instead of 26 (an 8k-token prompt: 2.3 us instead of 3.4).
 */
#define KVA_HASH_PIECE      128


uint64_t kva_hash_seed(uint64_t keyspace, const uint8_t *model,
    size_t model_len);

/*
 * Writes at most max_blocks hashes of the full blocks of data into out and
 * returns how many it wrote.
 */
size_t kva_hash_blocks(uint64_t seed, const uint8_t *data, size_t len,
    size_t block_size, uint64_t *out, size_t max_blocks);

/*
 * What a block hash means, in one place for the module, the simulator,
 * the tests and the benchmarks: a request body's prompt in canonical form
 * (kva_prompt.h), seeded by its model in the text key space, cut into full
 * blocks of block_size bytes, hashed as a chain.
 *
 * scratch holds the canonical prompt: body_len + KVA_PROMPT_OUT_SLACK
 * bytes.  hashes holds kva_hash_body_max(body_len, block_size) entries
 * (NULL when that is 0).  On KVA_PROMPT_OK *nblocks is set and p describes
 * the prompt; otherwise nothing was hashed.
 */
kva_prompt_rc_e kva_hash_body(const uint8_t *body, size_t body_len,
    size_t block_size, uint8_t *scratch, uint64_t *hashes, size_t *nblocks,
    kva_prompt_t *p);

/* the most blocks a body of body_len bytes can yield */
#define kva_hash_body_max(body_len, block_size)                              \
    (((body_len) + KVA_PROMPT_OUT_SLACK) / (block_size))


#endif /* _KVA_HASH_H_INCLUDED_ */
