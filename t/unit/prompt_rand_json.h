/*
 * The JSON pieces the random body generator builds its bodies from
 * (prompt_rand_json.c), and its draws.  Internal to prompt_rand*.c.
 */

#ifndef _KVA_PROMPT_RAND_JSON_H_INCLUDED_
#define _KVA_PROMPT_RAND_JSON_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "prompt_rand.h"


/* members of an object: serialized apart, then shuffled and joined */

typedef struct {
    buf_t     m[12];
    unsigned  n;
} members_t;


/* short names for the draws: the generators make one on nearly every line */

static inline uint64_t
rnd(void)
{
    return prompt_rand_u64();
}


static inline unsigned
rn(unsigned n)
{
    return prompt_rand_n(n);
}


/* formatted output into a growable buffer */
void buf_printf(buf_t *b, const char *fmt, ...);

/* sometimes, a few characters of JSON whitespace */
void gen_ws(buf_t *b);
/* the inside of a JSON string, about target bytes of it */
void gen_text(buf_t *b, size_t target, int allow_nul);
void gen_string(buf_t *b, size_t max);
/* mostly plain text with an escape now and then, 100 KB or more */
void gen_huge_string(buf_t *b);
/* a key and its colon; some of its characters written as \u escapes */
void gen_key(buf_t *b, const char *name);
/* a unique key no prompt rule looks at */
void gen_other_key(buf_t *b, unsigned i);
void gen_number(buf_t *b);
/* any value, objects and arrays no deeper than max_depth */
void gen_json(buf_t *b, unsigned depth, unsigned max_depth);

/* an emptied buffer for the next member */
buf_t *members_next(members_t *ms);
/* the members, shuffled, as an object; ms is emptied for reuse */
void members_emit(buf_t *b, members_t *ms);


#endif /* _KVA_PROMPT_RAND_JSON_H_INCLUDED_ */
