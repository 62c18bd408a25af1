/*
 * kvsim: token ids of a request, for the token key space (--keyspace
 * tokens) and POST /tokenize.  Pure: no libevent.
 *
 * A prompt given as token ids ("prompt": [ints]) is those ids.  Any other
 * prompt goes through a pseudo-tokenizer over the canonical prompt text
 * that the module's core hashes (kva_prompt_extract()): each 4-byte chunk
 * of it, the last one possibly shorter, is one token whose id is
 * XXH3-64 of the chunk modulo KVS_VOCAB.  It is not a real tokenizer; it
 * is stable across runs and machines, and /tokenize and the cache model
 * share it, so ids from /tokenize key the same blocks a request stores.
 */

#ifndef _KVSIM_TOKEN_H_INCLUDED_
#define _KVSIM_TOKEN_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_keys.h"


#define KVS_VOCAB           151936      /* Qwen2's vocabulary size */


typedef struct {
    uint32_t           *ids;            /* malloc'ed, kvs_tokens_free() */
    size_t              n;
    unsigned            from_body:1;    /* the prompt was token ids */
    unsigned            nomem:1;
    kva_token_body_t    tb;             /* the body as the module reads it:
                                           tb.p its kind and model */
} kvs_tokens_t;


/* ids receives (len + 3) / 4 ids; returns how many */
size_t kvs_tokenize_text(const uint8_t *text, size_t len, uint32_t *ids);

/*
 * The token ids of an OpenAI-style body (chat, completion, or vLLM's
 * /tokenize body), read by the module's own kva_token_body().
 * KVA_PROMPT_OK or the reason the body is no prompt, unless t->nomem; t
 * is to be freed in every case, and the body kept until then.
 */
kva_prompt_rc_e kvs_tokens_body(const uint8_t *body, size_t len,
    kvs_tokens_t *t);

/*
 * The keys of t's ids in the token key space, as the module keys the
 * same ids (kva_token_body_keys()): seeded by the body's model, else by
 * model (the server's --model), and by its "cache_salt".  *keys is
 * malloc'ed, NULL when out of memory; returns how many.
 */
size_t kvs_tokens_keys(kvs_tokens_t *t, const char *model,
    size_t block_tokens, uint64_t **keys);

void kvs_tokens_free(kvs_tokens_t *t);


#endif /* _KVSIM_TOKEN_H_INCLUDED_ */
