/*
 * The random request body generator of the differential prompt test,
 * prompt_rand.c and prompt_rand_json.c.  One RNG state drives both the
 * bodies and the test's own choices, so a seed reproduces the whole run.
 */

#ifndef _KVA_PROMPT_RAND_H_INCLUDED_
#define _KVA_PROMPT_RAND_H_INCLUDED_


#include <stdint.h>

#include "prompt_gen.h"


/* any seed, 0 included */
void prompt_rand_seed(uint64_t seed);
uint64_t prompt_rand_u64(void);
unsigned prompt_rand_n(unsigned n);

/* replaces b's contents with a new random body */
void prompt_gen_body(buf_t *b);

/* one to four byte-level changes: overwrite, delete or insert */
void prompt_mutate(buf_t *b);


#endif /* _KVA_PROMPT_RAND_H_INCLUDED_ */
