/*
 * kv_aware core: OpenAI-style request body -> canonical prompt bytes.
 *
 * Plain C, no nginx headers: linked by the module, the tools and the tests.
 */

#ifndef _KVA_PROMPT_H_INCLUDED_
#define _KVA_PROMPT_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_hash.h"
#include "kva_prompt_rc.h"


#define KVA_PROMPT_MODEL_MAX   256      /* longer model names: first bytes */

/*
 * The canonical form of a text prompt is never longer than the body plus
 * this (the separators the framing adds to what the JSON quoting removed).
 */
#define KVA_PROMPT_OUT_SLACK   64

/* separators in the canonical form; never produced by the framing itself */
#define KVA_SEP_ROLE           0x1f     /* after a message role */
#define KVA_SEP_MESSAGE        0x1e     /* after a message, a prompt string */
#define KVA_SEP_TOOLS          0x1d     /* after the raw tools value */


typedef struct {
    /* filled by kva_prompt_extract() */
    uint8_t        *out;            /* canonical bytes, caller's buffer */
    size_t          out_len;
    size_t          len;            /* the canonical prompt's length,
                                       written out or not */
    unsigned        truncated:1;    /* out was full: out holds a prefix */
    unsigned        kind:2;         /* KVA_PROMPT_KIND_* */

    uint8_t         model[KVA_PROMPT_MODEL_MAX];
    size_t          model_len;      /* 0 when there is no "model" string,
                                       or when the body is not valid JSON;
                                       set with KVA_PROMPT_NO_PROMPT too */

    /*
     * "prompt" is a flat array of token ids only (the completions API's
     * pre-tokenized form): out holds exactly nids ids, 4 bytes each,
     * little-endian, unless truncated.  4 * nids never passes
     * 2 * len + KVA_PROMPT_OUT_SLACK: an id takes 2 bytes of the body.
     */
    unsigned        token_ids:1;
    size_t          nids;

    /*
     * The top-level "cache_salt" string (vLLM's API), still quoted and
     * escaped, in the body: kva_prompt_salt() decodes it.  NULL: none.
     */
    const uint8_t  *salt;
    size_t          salt_len;
} kva_prompt_t;


#define KVA_PROMPT_KIND_NONE       0
#define KVA_PROMPT_KIND_MESSAGES   1
#define KVA_PROMPT_KIND_PROMPT     2
#define KVA_PROMPT_KIND_INPUT      3


/*
 * Validates the whole body as JSON (RFC 8259, UTF-8) and writes the canonical
 * prompt into out[0 .. out_cap).  When out fills up, the rest is validated
 * but not written and p->truncated is set: a prefix is all routing needs.
 * out_cap of len + KVA_PROMPT_OUT_SLACK never truncates text prompts.
 * out may be NULL when out_cap is 0: validation only.
 *
 * Canonical form, strings decoded:
 *   messages, input:  per object element: content, 0x1f, role (its first
 *                     64 bytes), 0x1e; per string (input only): text, 0x1e;
 *                     a "tools" value goes first, raw, then 0x1d
 *   prompt:           per string: text, 0x1e; per token id: 4 bytes
 *                     little-endian; per inner token list: its ids, 0x1e
 *
 * The first of "messages" (an array), "prompt" or "input" (a string or an
 * array) decides the kind; other types of them are skipped.  On duplicate
 * keys the first one wins, unlike jansson.
 */
kva_prompt_rc_e kva_prompt_extract(const uint8_t *body, size_t len,
    uint8_t *out, size_t out_cap, kva_prompt_t *p);

/*
 * The same scan feeding the canonical bytes to hs as well (NULL: none),
 * so that they are hashed without being written: out may be NULL with
 * out_cap 0.  When a "tools" value comes after the prompt, the prompt's
 * value is scanned a second time behind it (the body is valid by then).
 * kva_hash_body() is the caller.
 */
kva_prompt_rc_e kva_prompt_hash(const uint8_t *body, size_t len,
    uint8_t *out, size_t out_cap, kva_hash_stream_t *hs, kva_prompt_t *p);

/*
 * The same over a body in two pieces, hashing only: win holds the first
 * piece (seam bytes) and a copy of the second's first bytes, next and
 * next_len the whole second piece (kva_json_lex.h).  p->salt is not set.
 * KVA_PROMPT_SEAM: a number crosses the seam, scan a copy in one piece.
 * kva_hash_body2() is the caller.
 */
kva_prompt_rc_e kva_prompt_hash_split(const uint8_t *win, size_t win_len,
    size_t seam, const uint8_t *next, size_t next_len, kva_hash_stream_t *hs,
    kva_prompt_t *p);

const char *kva_prompt_strerror(kva_prompt_rc_e rc);

/*
 * The decoded bytes of a JSON string token (p->salt) into out, which has
 * room for len bytes (decoding never makes a string longer); returns
 * their length.
 */
size_t kva_prompt_salt(const uint8_t *str, size_t len, uint8_t *out);


#endif /* _KVA_PROMPT_H_INCLUDED_ */
