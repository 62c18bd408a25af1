/*
 * kva_session: the bindings of sessions to servers, a bounded table in
 * one region of memory (the upstream's zone).  A session is known by a
 * 64-bit key (a keyed hash of its header, never the header itself); its
 * entry names the server (slot) it is bound to and when it was last used.
 *
 * Every call does a bounded amount of work: a lookup walks one bucket's
 * chain (keys are keyed hashes and the buckets are as many as entries, so
 * chains stay short), and idle entries are swept a few at a time from the
 * least recently used end.  A full table gives up its least recently
 * used entry.  The caller serializes (the zone's lock).
 */

#ifndef _KVA_SESSION_H_INCLUDED_
#define _KVA_SESSION_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVA_SESSION_NIL      0xffffffffu
#define KVA_SESSION_SWEEP    2           /* idle entries swept a lookup */


typedef struct {
    uint64_t            key;             /* 0: free */
    uint64_t            used;            /* ms, of the last bind */
    uint32_t            prev;            /* towards the most recent */
    uint32_t            next;            /* towards the least recent */
    uint32_t            chain;           /* next in its bucket */
    uint32_t            slot;
} kva_session_entry_t;


typedef struct {
    uint32_t            capacity;
    uint32_t            used;
    uint32_t            mask;            /* buckets - 1 */
    uint32_t            head;            /* most recently used */
    uint32_t            tail;            /* least recently used */
    uint32_t            free;            /* free entries, by next */
    uint64_t            expired;         /* idle past the timeout */
    uint64_t            evicted;         /* given up to a new session */
    uint64_t            seed;            /* keys the keys: secret */
    uint32_t           *buckets;
    kva_session_entry_t  *entries;
} kva_session_t;


typedef enum {
    KVA_SESSION_NONE = 0,                /* not bound */
    KVA_SESSION_FOUND,                   /* bound, *slot its server */
    KVA_SESSION_EXPIRED                  /* was, idle too long: unbound */
} kva_session_rc_e;


/* bytes a table of capacity entries takes */
size_t kva_session_size(uint32_t capacity);

/* a table in mem of size bytes (kva_session_size()); NULL: too small */
kva_session_t *kva_session_init(void *mem, size_t size, uint32_t capacity);

/*
 * The server key is bound to; an entry idle for more than timeout ms
 * (0: never idle) is removed instead.  Sweeps a few idle entries.
 */
kva_session_rc_e kva_session_get(kva_session_t *t, uint64_t key,
    uint64_t now, uint64_t timeout, uint32_t *slot);

/* the key of a session's value, never 0: a hash keyed by t->seed */
uint64_t kva_session_key(kva_session_t *t, const void *data, size_t len);

/* binds key (not 0) to slot, as used now; a full table evicts the LRU */
void kva_session_bind(kva_session_t *t, uint64_t key, uint32_t slot,
    uint64_t now);


#endif /* _KVA_SESSION_H_INCLUDED_ */
