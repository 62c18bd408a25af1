/*
 * kv_aware core: a request body -> its block keys, in each key space.
 *
 * What a block key means, in one place for the module, the simulator,
 * the test hasher, the benchmarks and the fuzzers.  The body is read by
 * the prompt scanner (kva_prompt.h); the keys are the text key space's
 * (kva_hash.h) or the token key space's (kva_token.h).  Above the lexer
 * and the hasher: neither of them includes this.
 */

#ifndef _KVA_KEYS_H_INCLUDED_
#define _KVA_KEYS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_hash.h"
#include "kva_prompt.h"


/*
 * The text key space: a request body's prompt in canonical form, cut
 * into full blocks of block_size bytes, hashed as a chain with its model
 * folded in.  The prompt is hashed while it is scanned, never written out.
 *
 * scratch is NULL, or body_len + KVA_PROMPT_OUT_SLACK bytes that receive
 * the canonical prompt too (p->out).  hashes holds
 * kva_hash_body_max(body_len, block_size) entries (NULL when that is 0).
 * On KVA_PROMPT_OK *nblocks is set and p describes the prompt; otherwise
 * nothing was hashed.
 */
kva_prompt_rc_e kva_hash_body(const uint8_t *body, size_t body_len,
    size_t block_size, uint8_t *scratch, uint64_t *hashes, size_t *nblocks,
    kva_prompt_t *p);

/*
 * The same for a body in two pieces, a then b (nginx: the part read with
 * the headers, then the rest), without joining them: scratch holds
 * alen + KVA_HASH_SEAM bytes; hashes is sized for alen + blen.
 * KVA_PROMPT_SEAM: a number longer than KVA_HASH_SEAM bytes crosses from
 * a to b; join them and call kva_hash_body().
 */
kva_prompt_rc_e kva_hash_body2(const uint8_t *a, size_t alen,
    const uint8_t *b, size_t blen, size_t block_size, uint8_t *scratch,
    uint64_t *hashes, size_t *nblocks, kva_prompt_t *p);

/* the most blocks a body of body_len bytes can yield */
#define kva_hash_body_max(body_len, block_size)                              \
    (((body_len) + KVA_PROMPT_OUT_SLACK) / (block_size))


/*
 * The token key space: the body's own token ids ("prompt": [ids]), else
 * ids a tokenizer gave for it, as blocks of block_tokens ids seeded by
 * the body's model and its "cache_salt" (vLLM keys the first block with
 * [cache_salt] as its extra keys: XORed into the seed).  With neither,
 * the text keys of its canonical prompt in blocks of block_size bytes,
 * so that what was learned keeps routing while no ids come.  The two
 * key spaces are seeded apart and never share a key.
 *
 * Three steps, so that the caller sizes the keys' array in between:
 *   kva_token_body()       scans the body into scratch, which holds
 *                          kva_token_body_scratch(len) bytes aligned for
 *                          uint32_t; the body's ids, if any, lie there;
 *   kva_token_body_max()   picks the ids keyed: the body's, else ids[0..n)
 *                          (NULL: none); returns the most keys they yield;
 *   kva_token_body_keys()  writes at most max keys, returns how many.
 */
typedef struct {
    /* the caller's */
    size_t           block_size;    /* text keys: bytes a block */
    size_t           block_tokens;  /* token keys: ids a block */
    const uint8_t   *model;         /* seeds a body that names no model: */
    size_t           model_len;     /*   NULL, 0 (the module) or a name */

    /* kva_token_body()'s */
    kva_prompt_t     p;             /* the prompt, canonical in scratch */
    uint8_t         *scratch;
    const uint32_t  *ids;           /* the ids keyed, NULL: text keys */
    size_t           nids;
    unsigned         from_body:1;   /* ids are the body's own */
} kva_token_body_t;


/* an id takes 4 bytes out for 2 or more of the body (kva_prompt.h) */
#define kva_token_body_scratch(len)  (2 * (len) + KVA_PROMPT_OUT_SLACK)

kva_prompt_rc_e kva_token_body(const uint8_t *body, size_t len,
    uint8_t *scratch, kva_token_body_t *tb);
size_t kva_token_body_max(kva_token_body_t *tb, const uint32_t *ids,
    size_t n);
size_t kva_token_body_keys(kva_token_body_t *tb, uint64_t *out, size_t max);


#endif /* _KVA_KEYS_H_INCLUDED_ */
