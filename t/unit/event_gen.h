/*
 * Helpers of the event codec's unit tests (t/unit/test_event*.c).
 */

#ifndef _KVA_EVENT_GEN_H_INCLUDED_
#define _KVA_EVENT_GEN_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_event.h"


#define H   "\"0123456789abcdef\""
#define HDR "\"v\":1,\"server\":\"s\",\"seq\":1"


/* 1 if every byte of b is 0, as a failed decode leaves it */
int zeroed(const kva_batch_t *b);

/* decode from an exactly-sized heap copy; err: 128 bytes or NULL */
kva_event_rc_e dec(const char *msg, const kva_event_limits_t *lim,
    kva_batch_t *b, char *err);
kva_event_rc_e dec_len(const char *msg, size_t len,
    const kva_event_limits_t *lim, kva_batch_t *b, char *err);

/* the invariants kva_event.h promises of a decoded batch */
int sane(const kva_batch_t *b);

uint64_t random_hash(void);
void random_server(char *s, size_t *len);
/* b->events and *store are malloc'ed: the caller frees both */
void random_batch(kva_batch_t *b, uint64_t **store);

/* {"v":1,"server":"s","seq":1,"x":[item,item,...]}: n items, malloc'ed */
char *filler(const char *item, size_t n, size_t *len);


#endif /* _KVA_EVENT_GEN_H_INCLUDED_ */
