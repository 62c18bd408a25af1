/*
 * Unit tests of the block index (src/kva_index.c).
 */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_index.h"


static uint64_t
mix(uint64_t x)
{
    /* splitmix64: random-looking keys, like the XXH3 hashes in production */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}


static void
chain(uint64_t *h, uint32_t n, uint64_t seed)
{
    uint32_t  i;

    for (i = 0; i < n; i++) {
        h[i] = mix(seed * 1000003 + i);
    }
}


int
main(void)
{
    void              *region, *tiny;
    size_t             size;
    uint32_t           depth[KVA_MAX_SLOTS], deepest, i, cap;
    uint64_t           a[64], b[64], c[40000];
    kva_clock_t        clk = { 1000, 100, 10, 1 << 2 };
    kva_index_t       *ix;
    kva_slot_count_t   counts[KVA_MAX_SLOTS];

    ok(sizeof(kva_entry_t) == 40, "an entry is 40 bytes");

    size = kva_index_region_size(10000);
    ok(kva_index_capacity_for(size) == 10000, "capacity_for inverts size");
    ok((size - sizeof(kva_index_t)) / 10000 <= 48,
       "at most 48 bytes per entry, buckets included (%zu)",
       (size - sizeof(kva_index_t)) / 10000);
    tiny = malloc(16);
    ok(kva_index_init(tiny, 16) == NULL, "a tiny region is refused");
    free(tiny);

    region = malloc(size);
    ix = kva_index_init(region, size);
    ok(ix != NULL && kva_index_valid(ix, size), "index initialised");

    chain(a, 64, 1);
    chain(b, 64, 2);
    memcpy(b, a, 20 * sizeof(uint64_t));     /* b shares 20 blocks with a */

    memset(depth, 0xff, sizeof(depth));
    deepest = kva_index_match(ix, a, 64, 0x7, &clk, depth);
    ok(deepest == 0 && depth[0] == 0 && depth[1] == 0 && depth[2] == 0,
       "empty index matches nothing");

    kva_index_add(ix, a, 64, 1, KVA_BIT_LEARNED, &clk);
    kva_index_add(ix, b, 30, 2, KVA_BIT_EVENT, &clk);

    deepest = kva_index_match(ix, a, 64, 0x7, &clk, depth);
    ok(deepest == 64 && depth[1] == 64, "slot 1 holds all of a");
    ok(depth[2] == 20, "slot 2 holds the 20 shared blocks (%u)", depth[2]);
    ok(depth[0] == 0, "slot 0 holds nothing");

    deepest = kva_index_match(ix, b, 64, 0x7, &clk, depth);
    ok(deepest == 30 && depth[2] == 30 && depth[1] == 20,
       "b: slot 2 has 30, slot 1 has 20");

    deepest = kva_index_match(ix, a, 64, 0x1, &clk, depth);
    ok(deepest == 0, "mask excludes slots");

    /* precise slots trust events only, the others learned guesses only */
    clk.precise = 0;
    kva_index_match(ix, b, 30, 1 << 2, &clk, depth);
    ok(depth[2] == 0, "event bits of a degraded server are not trusted");
    clk.precise = 1 << 1 | 1 << 2;
    kva_index_match(ix, a, 64, 1 << 1, &clk, depth);
    ok(depth[1] == 0, "learned bits of a precise server are ignored");
    clk.precise = 1 << 2;

    /* TTL: learned bits fade, event bits do not */
    clk.now += 150;
    kva_index_match(ix, a, 64, 0x7, &clk, depth);
    ok(depth[1] == 0 && depth[2] == 20, "learned entries expire by TTL");

    /* touching an entry must not revive another slot's expired bits */
    kva_index_add(ix, a, 1, 3, KVA_BIT_LEARNED, &clk);
    kva_index_match(ix, a, 1, 0xf, &clk, depth);
    ok(depth[1] == 0 && depth[3] == 1, "a touch does not revive others");

    kva_index_add(ix, a, 5, 4, KVA_BIT_SPEC, &clk);
    kva_index_match(ix, a, 5, 1 << 4, &clk, depth);
    ok(depth[4] == 5, "speculative entries count while fresh");
    clk.now += 11;
    kva_index_match(ix, a, 5, 1 << 4, &clk, depth);
    ok(depth[4] == 0, "speculative entries expire sooner");

    /* removal */
    kva_index_del(ix, b + 10, 1, 2, KVA_BIT_EVENT);
    kva_index_match(ix, b, 64, 1 << 2, &clk, depth);
    ok(depth[2] == 10, "a removed block ends the match (%u)", depth[2]);

    kva_index_drop_slots(ix, 1 << 2, KVA_BITS_ALL);
    kva_index_match(ix, b, 64, 1 << 2, &clk, depth);
    ok(depth[2] == 0, "drop_slots clears a slot");

    kva_index_count(ix, &clk, counts);
    ok(counts[2].entries[KVA_SRC_EVENT] == 0 && counts[3].entries[1] == 1,
       "counts per slot and source");

    /* eviction keeps the index bounded and prefers old entries */
    free(region);
    cap = 1000;
    size = kva_index_region_size(cap);
    region = malloc(size);
    ix = kva_index_init(region, size);
    clk.now = 1;
    clk.ttl_learned = 1u << 30;

    chain(c, 4100, 7);
    kva_index_add(ix, c, 100, 0, KVA_BIT_LEARNED, &clk);    /* old */

    for (i = 0; i < 40; i++) {
        clk.now += 10;
        kva_index_add(ix, c + 100 + i * 100, 100, 1, KVA_BIT_LEARNED, &clk);

        if (i == 5) {
            /* keep the old prefix hot */
            kva_index_add(ix, c, 100, 0, KVA_BIT_LEARNED, &clk);
        }
    }

    ok(ix->used <= cap, "used %u <= capacity %u", ix->used, cap);
    ok(ix->evictions > 0, "evicted %llu entries",
       (unsigned long long) ix->evictions);

    kva_index_match(ix, c + 100, 100, 1 << 1, &clk, depth);
    ok(depth[1] == 0, "the oldest unused prefix was evicted");

    kva_index_match(ix, c + 3900, 100, 1 << 1, &clk, depth);
    ok(depth[1] == 100, "the newest prefix is intact");

    /* hints from a lookup survive evictions made by the add they guide */
    {
        uint32_t  found[100];

        kva_index_match_found(ix, c + 3900, 100, 1 << 1, &clk, depth,
                              found);
        ok(found[0] != KVA_NIL && found[99] != KVA_NIL,
           "match records where it found each block");

        clk.now += 10;
        chain(c, 200, 11);
        /* hints for c[100..] used for c[0..], across evictions */
        kva_index_match_found(ix, c + 100, 100, 1 << 3, &clk, depth, found);
        kva_index_add_found(ix, c + 100, 100, 3, KVA_BIT_LEARNED, &clk,
                            found);
        kva_index_match_found(ix, c + 100, 100, 1 << 3, &clk, depth, found);
        kva_index_add_found(ix, c, 100, 3, KVA_BIT_LEARNED, &clk, found);
        kva_index_add_found(ix, c + 100, 100, 3, KVA_BIT_LEARNED, &clk,
                            found);
        kva_index_match(ix, c, 200, 1 << 3, &clk, depth);
        ok(depth[3] == 200, "stale hints are checked, not trusted (%u)",
           depth[3]);
    }

    /* lookup cost does not depend on size: chains stay short at full load */
    free(region);
    size = kva_index_region_size(40000);
    region = malloc(size);
    ix = kva_index_init(region, size);
    chain(c, 40000, 9);
    kva_index_add(ix, c, 40000, 0, KVA_BIT_LEARNED, &clk);
    kva_index_match(ix, c, 40000, 1, &clk, depth);
    ok(depth[0] == 40000 && ix->used == 40000, "full index holds all");

    {
        uint32_t  *buckets, longest, len, idx;
        kva_entry_t  *entries;

        buckets = (uint32_t *) (ix + 1);
        entries = (kva_entry_t *) (buckets + ix->nbuckets);
        longest = 0;

        for (i = 0; i < ix->nbuckets; i++) {
            for (len = 0, idx = buckets[i]; idx != KVA_NIL;
                 idx = entries[idx].next)
            {
                len++;
            }

            longest = len > longest ? len : longest;
        }

        ok(longest <= 16, "longest chain %u at full load", longest);
    }

    /* the index is position independent: a copy elsewhere still works */
    {
        void  *copy = malloc(size);

        memcpy(copy, region, size);
        memset(region, 0, size);
        kva_index_match(copy, c, 100, 1, &clk, depth);
        ok(depth[0] == 100, "a copied region works at another address");
        free(copy);
    }

    free(region);

    return done_testing();
}
