/*
 * kv_aware core: the token key space.  What a block of token ids means,
 * in one place for the module (token ids from a request or a tokenizer),
 * kvbridge (token ids from vLLM's and SGLang's events) and the tests.
 *
 * A block is block_tokens token ids.  Its key is the raw chain of
 * kva_hash_blocks() (kva_hash.h) over the ids as 4-byte little-endian
 * integers, seeded by kva_token_seed() of the model (the text key space
 * folds its model in last instead): the name a request's "model" field
 * carries, a LoRA adapter's name for the adapter's blocks.  A block
 * that the engine keys with more than its tokens (an image, a cache salt)
 * has that extra key XORed into its seed, so that it, and every block
 * after it, never matches a prompt that lacks it.  docs/events.md says
 * the same for publishers that do not link this file.
 */

#ifndef _KVA_TOKEN_H_INCLUDED_
#define _KVA_TOKEN_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_list.h"


/*
 * What became of a request's call to the tokenizer (kv_aware_tokenize):
 * ids, or one of the two fallbacks.  kva_tokenize_names[] in this order.
 */
#define KVA_TOKENIZE_RESULTS(X)                                               \
    X(KVA_TOKENIZE_OK, "ok")                                                  \
    X(KVA_TOKENIZE_FAILED, "failed")                                          \
    X(KVA_TOKENIZE_TIMEOUT, "timeout")

typedef enum {
    KVA_TOKENIZE_RESULTS(KVA_LIST_ENUM)
    KVA_TOKENIZE_LAST
} kva_tokenize_e;

extern const char  *const kva_tokenize_names[];


/* key spaces never share hashes: text's seed is "kva-text" */
#define KVA_KEYSPACE_TOKENS  0x6b76612d746f6b73ULL   /* "kva-toks" */

/* an extra key's own seed, so it cannot be mistaken for a block's */
#define KVA_TOKEN_EXTRA_SEED 0x6b76612d78747261ULL   /* "kva-xtra" */


uint64_t kva_token_seed(const uint8_t *model, size_t model_len);

/*
 * Keys of the full blocks of ids[0 .. n) into out, at most max_blocks;
 * returns how many.  extra is NULL or one value per block (0: none), each
 * from kva_token_extra().
 */
size_t kva_token_blocks(uint64_t seed, const uint32_t *ids, size_t n,
    size_t block_tokens, const uint64_t *extra, uint64_t *out,
    size_t max_blocks);

/* an extra key from its canonical bytes (kvbridge: msgpack of the keys) */
uint64_t kva_token_extra(const uint8_t *bytes, size_t len);

/*
 * The extra key of a prompt's first block under vLLM's "cache_salt": its
 * extra keys are [salt], so the canonical bytes are msgpack of a
 * one-element array holding the string, as kvbridge packs them.  scratch
 * has room for len + KVA_TOKEN_SALT_SLACK bytes.
 */
#define KVA_TOKEN_SALT_SLACK  6

uint64_t kva_token_salt(const uint8_t *salt, size_t len, uint8_t *scratch);


#endif /* _KVA_TOKEN_H_INCLUDED_ */
