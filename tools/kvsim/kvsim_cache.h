/*
 * kvsim: one server's paged KV cache, the pure model (no libevent).
 *
 * A pool of blocks.  A block is free, active (referenced by running
 * sequences) or cached (hashed, unreferenced, evictable LRU).  Hashed
 * blocks are found by their chained prefix hash.  Every store and eviction
 * is appended to an op log that the publisher turns into KV events.
 */

#ifndef _KVSIM_CACHE_H_INCLUDED_
#define _KVSIM_CACHE_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVS_NIL             0xffffffffu
#define KVS_OPS_MAX         (1u << 20)  /* unpublished ops kept at most */


typedef enum {
    KVS_OP_STORED = 0,
    KVS_OP_REMOVED
} kvs_op_e;


typedef struct {
    uint64_t            hash;
    uint64_t            parent;         /* stored: previous block, 0: none */
    kvs_op_e            type;

    /* an engine's view (--events zmq), when the sequence had one */
    uint32_t            ids;            /* in ids of the cache, or KVS_NIL */
    uint32_t            lora;           /* 0: none, else adapter index + 1 */
    uint64_t            ehash;
    uint64_t            eparent;        /* 0: none */
} kvs_op_t;


/* what an engine says about a block besides our key (kvs_seq_t has it) */
typedef struct {
    const uint32_t     *ids;            /* the block's token ids */
    uint32_t            nids;
    uint32_t            lora;
    uint64_t            ehash;
    uint64_t            eparent;
} kvs_engine_block_t;


typedef struct {
    uint64_t            hash;
    uint64_t            parent;
    uint64_t            ehash;          /* the engine's, 0: none */
    uint32_t            ref;
    uint32_t            prev;           /* LRU list */
    uint32_t            next;           /* LRU list or free list */
    uint32_t            chain;          /* hash bucket chain */
    unsigned            hashed:1;
} kvs_block_t;


typedef struct {
    kvs_block_t        *blocks;
    uint32_t           *buckets;
    uint32_t            nblocks;
    uint32_t            mask;           /* buckets - 1 */
    uint32_t            free_head;
    uint32_t            nfree;
    uint32_t            lru_head;       /* evicted first */
    uint32_t            lru_tail;
    uint32_t            nlru;
    uint32_t            nhashed;
    uint32_t            nactive;        /* ref > 0 */

    kvs_op_t           *ops;
    size_t              nops;
    size_t              ops_cap;
    unsigned            ops_lost:1;     /* op log overflowed since clear */

    uint32_t           *ids;            /* token ids of stored ops */
    size_t              nids;
    size_t              ids_cap;

    uint64_t            evictions;
} kvs_cache_t;


int kvs_cache_init(kvs_cache_t *c, uint32_t nblocks);
void kvs_cache_free(kvs_cache_t *c);

uint32_t kvs_cache_lookup(kvs_cache_t *c, uint64_t hash);
/* leading hashes present, stops at the first miss */
uint32_t kvs_cache_match(kvs_cache_t *c, const uint64_t *h, uint32_t n);

void kvs_cache_acquire(kvs_cache_t *c, uint32_t b);
/* an anonymous block with ref 1, evicting LRU if needed; KVS_NIL: full */
uint32_t kvs_cache_alloc(kvs_cache_t *c);
void kvs_cache_release(kvs_cache_t *c, uint32_t b);
/* names a computed anonymous block; 0 when the hash is already cached */
int kvs_cache_commit(kvs_cache_t *c, uint32_t b, uint64_t hash,
    uint64_t parent);
/* the same, the op logged with the engine's view of the block */
int kvs_cache_commit_engine(kvs_cache_t *c, uint32_t b, uint64_t hash,
    uint64_t parent, const kvs_engine_block_t *eb);

/* every hashed block, out must hold c->nhashed; returns the count */
uint32_t kvs_cache_snapshot(kvs_cache_t *c, uint64_t *out);
void kvs_cache_ops_clear(kvs_cache_t *c);

#define kvs_cache_available(c)  ((c)->nfree + (c)->nlru)
#define kvs_cache_usage(c)                                                  \
    ((c)->nblocks ? (double) (c)->nactive / (c)->nblocks : 0.0)


#endif /* _KVSIM_CACHE_H_INCLUDED_ */
