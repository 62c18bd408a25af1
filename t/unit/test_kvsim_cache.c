/*
 * Unit tests of kvsim's block pool (tools/kvsim/kvsim_cache.c): lookups,
 * refcounts, LRU eviction order, the op log that becomes KV events, and
 * snapshots.
 */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kvsim_cache.h"


static int
has(const uint64_t *v, uint32_t n, uint64_t h)
{
    uint32_t  i;

    for (i = 0; i < n; i++) {
        if (v[i] == h) {
            return 1;
        }
    }

    return 0;
}


int
main(void)
{
    int          i, rc, distinct;
    uint32_t     b[8], x, n;
    uint64_t     h[8], snap[8];
    kvs_cache_t  c;

    for (i = 0; i < 8; i++) {
        h[i] = 0x1000 + i * 0x10001ULL;
    }

    /* ok() evaluates its condition twice: no side effects in it */
    rc = kvs_cache_init(&c, 0);
    ok(rc != 0, "an empty pool is refused");
    rc = kvs_cache_init(&c, 8);
    ok(rc == 0, "a pool of 8 blocks");
    ok(kvs_cache_available(&c) == 8 && kvs_cache_usage(&c) == 0.0,
       "all free at first");

    for (i = 0; i < 4; i++) {
        b[i] = kvs_cache_alloc(&c);
    }

    distinct = (b[0] != b[1] && b[1] != b[2] && b[2] != b[3]
                && b[3] != KVS_NIL);
    ok(distinct, "allocations are distinct blocks");
    ok(kvs_cache_available(&c) == 4 && kvs_cache_usage(&c) == 0.5,
       "usage counts referenced blocks (%g)", kvs_cache_usage(&c));

    ok(kvs_cache_match(&c, h, 4) == 0, "nothing matches before commit");

    for (i = 0; i < 4; i++) {
        kvs_cache_commit(&c, b[i], h[i], i ? h[i - 1] : 0);
    }

    ok(kvs_cache_match(&c, h, 4) == 4 && c.nhashed == 4,
       "committed blocks match as a prefix");
    ok(kvs_cache_lookup(&c, h[2]) == b[2], "lookup finds the block");

    {
        uint64_t  gap[3] = { h[0], 0xdead, h[2] };

        ok(kvs_cache_match(&c, gap, 3) == 1, "match stops at the first miss");
    }

    ok(c.nops == 4, "four ops logged");
    ok(c.ops[0].type == KVS_OP_STORED && c.ops[0].hash == h[0]
       && c.ops[0].parent == 0 && c.ops[3].hash == h[3]
       && c.ops[3].parent == h[2],
       "stored ops in prefix order with parents");

    x = kvs_cache_alloc(&c);
    rc = kvs_cache_commit(&c, x, h[1], h[0]);
    ok(rc == 0, "a hash already cached is not stored twice");
    kvs_cache_release(&c, x);
    ok(c.nfree == 4 && c.nops == 4,
       "the duplicate goes back to the free list, no op");

    kvs_cache_ops_clear(&c);

    /* finish the sequence: tail first, so the tail is evicted first */
    for (i = 3; i >= 0; i--) {
        kvs_cache_release(&c, b[i]);
    }

    ok(c.nlru == 4 && c.nactive == 0 && kvs_cache_available(&c) == 8,
       "released hashed blocks stay cached and evictable");
    ok(kvs_cache_match(&c, h, 4) == 4, "still a prefix hit after release");

    /* a second user of block 0 protects it */
    kvs_cache_acquire(&c, b[0]);
    ok(c.nlru == 3 && c.blocks[b[0]].ref == 1, "acquire leaves the LRU");

    for (i = 4; i < 8; i++) {
        b[i] = kvs_cache_alloc(&c);     /* the 4 free blocks */
    }

    ok(c.nops == 0 && c.nfree == 0, "free blocks are used before evicting");

    x = kvs_cache_alloc(&c);
    ok(x == b[3] && c.nops == 1 && c.ops[0].type == KVS_OP_REMOVED
       && c.ops[0].hash == h[3], "LRU evicts the tail of the prefix first");
    ok(kvs_cache_lookup(&c, h[3]) == KVS_NIL && c.evictions == 1,
       "the evicted hash is gone");

    x = kvs_cache_alloc(&c);
    ok(x == b[2] && c.ops[1].hash == h[2], "then the block before it");
    x = kvs_cache_alloc(&c);
    ok(x == b[1] && c.ops[2].hash == h[1], "then the one before");

    x = kvs_cache_alloc(&c);
    ok(x == KVS_NIL && c.nops == 3,
       "a referenced block is never evicted: the pool is full");
    ok(kvs_cache_match(&c, h, 4) == 1, "block 0 survived");

    /* LRU order follows release order */
    kvs_cache_commit(&c, b[4], h[4], 0);
    kvs_cache_commit(&c, b[5], h[5], 0);
    kvs_cache_release(&c, b[5]);
    kvs_cache_release(&c, b[4]);
    kvs_cache_release(&c, b[0]);        /* block 0: most recently used */
    kvs_cache_acquire(&c, b[5]);        /* touch b5 ... */
    kvs_cache_release(&c, b[5]);        /* ... it becomes MRU */
    kvs_cache_ops_clear(&c);

    x = kvs_cache_alloc(&c);
    ok(x == b[4] && c.ops[0].hash == h[4], "least recently released first");
    x = kvs_cache_alloc(&c);
    ok(x == b[0], "then block 0");
    x = kvs_cache_alloc(&c);
    ok(x == b[5], "the touched block last");

    /* snapshot */
    kvs_cache_free(&c);
    kvs_cache_init(&c, 8);

    for (i = 0; i < 6; i++) {
        b[i] = kvs_cache_alloc(&c);
    }

    kvs_cache_commit(&c, b[0], h[0], 0);
    kvs_cache_commit(&c, b[1], h[1], h[0]);
    kvs_cache_commit(&c, b[2], h[2], h[1]);
    kvs_cache_release(&c, b[2]);        /* cached, unreferenced */
    kvs_cache_release(&c, b[5]);        /* anonymous: freed */

    n = kvs_cache_snapshot(&c, snap);
    ok(n == 3 && has(snap, n, h[0]) && has(snap, n, h[1])
       && has(snap, n, h[2]),
       "snapshot: every hashed block, active or cached (%u)", n);

    for (i = 0; i < 3; i++) {
        x = kvs_cache_alloc(&c);        /* the free list first */
    }

    x = kvs_cache_alloc(&c);            /* then evicts b[2] */
    n = kvs_cache_snapshot(&c, snap);
    ok(n == 2 && !has(snap, n, h[2]), "snapshot: evicted blocks leave it");

    kvs_cache_ops_clear(&c);
    ok(c.nops == 0 && !c.ops_lost, "op log cleared");

    kvs_cache_free(&c);

    return done_testing();
}
