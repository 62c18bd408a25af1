/*
 * kv_aware core: the schema of a tokenizer's answer, the token ids that
 * keys=tokens asks for (the module's kv_aware_tokenize) when a request
 * brings none of its own.
 */

#ifndef _KVA_TOKEN_ANSWER_H_INCLUDED_
#define _KVA_TOKEN_ANSWER_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_prompt_rc.h"


/*
 * A tokenizer's answer: vLLM's /tokenize ({"tokens": [...]}) or a
 * render-style object with "token_ids" or "prompt_token_ids" at any
 * depth.  The first such member whose value is an array of token ids
 * (integers 0 .. 2^32-1) wins; its first max ids go to ids, *n says how
 * many.  KVA_PROMPT_NO_PROMPT when the answer holds no such array.
 * Validates the whole answer as kva_prompt_extract() does.
 */
kva_prompt_rc_e kva_prompt_token_answer(const uint8_t *body, size_t len,
    uint32_t *ids, size_t max, size_t *n);


#endif /* _KVA_TOKEN_ANSWER_H_INCLUDED_ */
