/*
 * kv_aware core: a JSON value walked member by member over the lexer
 * (kva_json_lex.h), for the schemas that read a body: the prompt
 * (kva_prompt.c) and a tokenizer's answer (kva_token_answer.c).  A schema
 * names the keys it looks for; the walker hands each value to the
 * schema's handler with the key's id and skips, but still validates,
 * whatever the handler leaves.
 */

#ifndef _KVA_JSON_WALK_H_INCLUDED_
#define _KVA_JSON_WALK_H_INCLUDED_


#include <stddef.h>

#include "kva_json_lex.h"


#define KVA_JSON_KEY_OTHER  0
#define KVA_JSON_KEY_MAX    24      /* longer keys are never looked for */


typedef struct {
    const char        *name;
    size_t             len;
    unsigned           id;          /* not KVA_JSON_KEY_OTHER */
} kva_json_key_t;


/* a schema's state starts with one of these, handlers cast back to it */
typedef struct {
    kva_json_lex_t         lx;
    unsigned               depth;
    const kva_json_key_t  *keys;
    size_t                 nkeys;
} kva_json_walk_t;


/* called with w->lx.pos at a member's or an element's value */
typedef int (*kva_json_item_pt)(kva_json_walk_t *w, unsigned key, void *ctx);


/*
 * w->lx.pos is at '{' or '['.  Calls item for each value; array elements
 * come with KVA_JSON_KEY_OTHER, members with the id of their key.  This
 * is the only place the depth grows (KVA_PROMPT_MAX_DEPTH), and every
 * recursion of a schema goes through it.  0, or -1 with w->lx.rc set.
 */
int kva_json_walk(kva_json_walk_t *w, kva_json_item_pt item, void *ctx);

/* past the value at w->lx.pos, validated */
int kva_json_skip(kva_json_walk_t *w);

/*
 * A whole body: its value (walked with item when it is a container that
 * opens, else skipped), then nothing but white space.
 */
int kva_json_walk_body(kva_json_walk_t *w, const char *opens,
    kva_json_item_pt item, void *ctx);


#endif /* _KVA_JSON_WALK_H_INCLUDED_ */
