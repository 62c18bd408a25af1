/*
 * kvsim: one server's paged KV cache, the pure model (no libevent).
 */

#include <stdlib.h>
#include <string.h>

#include "kvsim_cache.h"


#define kvs_bucket(c, h)    ((uint32_t) ((h) ^ ((h) >> 32)) & (c)->mask)


static void kvs_lru_unlink(kvs_cache_t *c, uint32_t b);
static void kvs_lru_append(kvs_cache_t *c, uint32_t b);
static void kvs_table_del(kvs_cache_t *c, uint32_t b);
static kvs_op_t *kvs_op_add(kvs_cache_t *c, kvs_op_e type, uint64_t hash,
    uint64_t parent);
static void kvs_op_engine(kvs_cache_t *c, kvs_op_t *op,
    const kvs_engine_block_t *eb);


int
kvs_cache_init(kvs_cache_t *c, uint32_t nblocks)
{
    uint32_t  i, nb;

    memset(c, 0, sizeof(kvs_cache_t));

    if (nblocks == 0 || nblocks > (1u << 30)) {
        return -1;
    }

    for (nb = 1; nb < nblocks; nb <<= 1) { /* void */ }

    c->blocks = calloc(nblocks, sizeof(kvs_block_t));
    c->buckets = malloc(nb * sizeof(uint32_t));

    if (c->blocks == NULL || c->buckets == NULL) {
        kvs_cache_free(c);
        return -1;
    }

    memset(c->buckets, 0xff, nb * sizeof(uint32_t));

    for (i = 0; i < nblocks; i++) {
        c->blocks[i].next = (i + 1 < nblocks) ? i + 1 : KVS_NIL;
    }

    c->nblocks = nblocks;
    c->mask = nb - 1;
    c->free_head = 0;
    c->nfree = nblocks;
    c->lru_head = KVS_NIL;
    c->lru_tail = KVS_NIL;

    return 0;
}


void
kvs_cache_free(kvs_cache_t *c)
{
    free(c->blocks);
    free(c->buckets);
    free(c->ops);
    free(c->ids);
    memset(c, 0, sizeof(kvs_cache_t));
}


uint32_t
kvs_cache_lookup(kvs_cache_t *c, uint64_t hash)
{
    uint32_t  b;

    for (b = c->buckets[kvs_bucket(c, hash)]; b != KVS_NIL;
         b = c->blocks[b].chain)
    {
        if (c->blocks[b].hash == hash) {
            return b;
        }
    }

    return KVS_NIL;
}


uint32_t
kvs_cache_match(kvs_cache_t *c, const uint64_t *h, uint32_t n)
{
    uint32_t  i;

    for (i = 0; i < n; i++) {
        if (kvs_cache_lookup(c, h[i]) == KVS_NIL) {
            break;
        }
    }

    return i;
}


void
kvs_cache_acquire(kvs_cache_t *c, uint32_t b)
{
    if (c->blocks[b].ref++ == 0) {
        kvs_lru_unlink(c, b);
        c->nactive++;
    }
}


uint32_t
kvs_cache_alloc(kvs_cache_t *c)
{
    uint32_t      b;
    kvs_op_t     *op;
    kvs_block_t  *blk;

    if (c->free_head != KVS_NIL) {
        b = c->free_head;
        c->free_head = c->blocks[b].next;
        c->nfree--;

    } else if (c->lru_head != KVS_NIL) {
        b = c->lru_head;
        kvs_lru_unlink(c, b);
        kvs_table_del(c, b);
        op = kvs_op_add(c, KVS_OP_REMOVED, c->blocks[b].hash, 0);

        if (op != NULL) {
            op->ehash = c->blocks[b].ehash;
        }

        c->evictions++;

    } else {
        return KVS_NIL;
    }

    blk = &c->blocks[b];
    memset(blk, 0, sizeof(kvs_block_t));
    blk->ref = 1;
    blk->prev = KVS_NIL;
    blk->next = KVS_NIL;
    blk->chain = KVS_NIL;
    c->nactive++;

    return b;
}


void
kvs_cache_release(kvs_cache_t *c, uint32_t b)
{
    kvs_block_t  *blk;

    blk = &c->blocks[b];

    if (blk->ref == 0 || --blk->ref > 0) {
        return;
    }

    c->nactive--;

    if (blk->hashed) {
        kvs_lru_append(c, b);
        return;
    }

    blk->next = c->free_head;
    c->free_head = b;
    c->nfree++;
}


int
kvs_cache_commit(kvs_cache_t *c, uint32_t b, uint64_t hash, uint64_t parent)
{
    return kvs_cache_commit_engine(c, b, hash, parent, NULL);
}


int
kvs_cache_commit_engine(kvs_cache_t *c, uint32_t b, uint64_t hash,
    uint64_t parent, const kvs_engine_block_t *eb)
{
    uint32_t      bucket;
    kvs_op_t     *op;
    kvs_block_t  *blk;

    blk = &c->blocks[b];

    if (blk->hashed || kvs_cache_lookup(c, hash) != KVS_NIL) {
        return 0;
    }

    bucket = kvs_bucket(c, hash);
    blk->hash = hash;
    blk->parent = parent;
    blk->hashed = 1;
    blk->chain = c->buckets[bucket];
    c->buckets[bucket] = b;
    c->nhashed++;

    op = kvs_op_add(c, KVS_OP_STORED, hash, parent);

    if (eb != NULL) {
        blk->ehash = eb->ehash;

        if (op != NULL) {
            kvs_op_engine(c, op, eb);
        }
    }

    return 1;
}


uint32_t
kvs_cache_snapshot(kvs_cache_t *c, uint64_t *out)
{
    uint32_t  i, n;

    n = 0;

    for (i = 0; i < c->nblocks; i++) {
        if (c->blocks[i].hashed) {
            out[n++] = c->blocks[i].hash;
        }
    }

    return n;
}


void
kvs_cache_ops_clear(kvs_cache_t *c)
{
    c->nops = 0;
    c->nids = 0;
    c->ops_lost = 0;
}


static void
kvs_lru_unlink(kvs_cache_t *c, uint32_t b)
{
    kvs_block_t  *blk;

    blk = &c->blocks[b];

    if (blk->prev != KVS_NIL) {
        c->blocks[blk->prev].next = blk->next;

    } else {
        c->lru_head = blk->next;
    }

    if (blk->next != KVS_NIL) {
        c->blocks[blk->next].prev = blk->prev;

    } else {
        c->lru_tail = blk->prev;
    }

    blk->prev = KVS_NIL;
    blk->next = KVS_NIL;
    c->nlru--;
}


static void
kvs_lru_append(kvs_cache_t *c, uint32_t b)
{
    kvs_block_t  *blk;

    blk = &c->blocks[b];
    blk->next = KVS_NIL;
    blk->prev = c->lru_tail;

    if (c->lru_tail != KVS_NIL) {
        c->blocks[c->lru_tail].next = b;

    } else {
        c->lru_head = b;
    }

    c->lru_tail = b;
    c->nlru++;
}


static void
kvs_table_del(kvs_cache_t *c, uint32_t b)
{
    uint32_t  *p;

    for (p = &c->buckets[kvs_bucket(c, c->blocks[b].hash)]; *p != KVS_NIL;
         p = &c->blocks[*p].chain)
    {
        if (*p == b) {
            *p = c->blocks[b].chain;
            c->nhashed--;
            return;
        }
    }
}


static kvs_op_t *
kvs_op_add(kvs_cache_t *c, kvs_op_e type, uint64_t hash, uint64_t parent)
{
    size_t     cap;
    kvs_op_t  *ops;

    if (c->nops == c->ops_cap) {
        cap = c->ops_cap ? c->ops_cap * 2 : 256;
        ops = (cap <= KVS_OPS_MAX) ? realloc(c->ops, cap * sizeof(kvs_op_t))
                                   : NULL;
        if (ops == NULL) {
            /* the publisher skips a seq, receivers resync */
            c->nops = 0;
            c->nids = 0;
            c->ops_lost = 1;
            return NULL;
        }

        c->ops = ops;
        c->ops_cap = cap;
    }

    memset(&c->ops[c->nops], 0, sizeof(kvs_op_t));
    c->ops[c->nops].type = type;
    c->ops[c->nops].hash = hash;
    c->ops[c->nops].parent = parent;
    c->ops[c->nops].ids = KVS_NIL;

    return &c->ops[c->nops++];
}


static void
kvs_op_engine(kvs_cache_t *c, kvs_op_t *op, const kvs_engine_block_t *eb)
{
    size_t     cap;
    uint32_t  *ids;

    if (c->nids + eb->nids > c->ids_cap) {
        for (cap = c->ids_cap ? c->ids_cap : 4096; cap < c->nids + eb->nids;
             cap *= 2)
        { /* void */ }

        ids = (cap <= (size_t) KVS_OPS_MAX * 16)
              ? realloc(c->ids, cap * sizeof(uint32_t)) : NULL;
        if (ids == NULL) {
            /* as a lost op log: the publisher skips a seq */
            c->nops = 0;
            c->nids = 0;
            c->ops_lost = 1;
            return;
        }

        c->ids = ids;
        c->ids_cap = cap;
    }

    memcpy(&c->ids[c->nids], eb->ids, eb->nids * sizeof(uint32_t));
    op->ids = c->nids;
    op->lora = eb->lora;
    op->ehash = eb->ehash;
    op->eparent = eb->eparent;
    c->nids += eb->nids;
}
