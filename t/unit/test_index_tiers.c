/*
 * Unit tests of storage tiers in the block index: a server's event copy
 * of a block in GPU memory, host memory or on disk (kva_tier_srcs()),
 * kept per (block, holder), counted by a match that goes on through it,
 * lifted by a store on GPU, gone with the last copy.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_index.h"


#define CPU     kva_tier_srcs(KVA_TIER_CPU)
#define DISK    kva_tier_srcs(KVA_TIER_DISK)


static kva_index_t       *ix;
static kva_clock_t        clk;
static uint32_t           depth[KVA_MAX_SLOTS];
static kva_tier_count_t   tiers[KVA_MAX_SLOTS];


static int
sound(const char *what)
{
    char  err[128];

    if (kva_index_check(ix, err, sizeof(err)) == 0) {
        return 1;
    }

    printf("# %s: %s\n", what, err);

    return 0;
}


/* the match of hashes[0 .. n) for the slots of mask, with tiers */
static uint32_t
match(const uint64_t *h, uint32_t n, const kva_slotset_t *mask)
{
    uint32_t       reached;
    kva_slotset_t  alive;

    memset(depth, 0, sizeof(depth));
    memset(tiers, 0, sizeof(tiers));
    alive = *mask;

    reached = kva_index_match_part(ix, h, 0, n, &alive, &clk, depth, NULL,
                                   tiers);

    return kva_index_match_done(n, reached, &alive, depth, NULL);
}


static kva_slotset_t *
slots(unsigned a, unsigned b)
{
    static kva_slotset_t  set;

    kva_slotset_zero(&set);
    kva_slotset_add(&set, a);
    kva_slotset_add(&set, b);

    return &set;
}


int
main(void)
{
    void              *region;
    size_t             size;
    unsigned           s;
    uint64_t           h[8], seven[1];
    kva_slot_count_t  *counts;

    size = kva_index_region_size(4096);
    region = calloc(1, size);
    counts = calloc(KVA_MAX_SLOTS, sizeof(kva_slot_count_t));

    if (region == NULL || counts == NULL) {
        return 1;
    }

    ix = kva_index_init(region, size, 0x1234567);

    memset(&clk, 0, sizeof(clk));
    clk.now = 1000;
    clk.ttl_learned = 100;
    clk.ttl_spec = 10;

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        kva_slotset_add(&clk.precise, s);
    }

    for (s = 0; s < 8; s++) {
        h[s] = 0x9000 + s;
    }

    /* slot 1 holds 0..7 on GPU; slot 2 holds 0..1, 2..5 in host memory,
     * 6..7 on GPU */
    kva_index_add(ix, h, 8, 1, KVA_BIT_EVENT, &clk);
    kva_index_add(ix, h, 2, 2, KVA_BIT_EVENT, &clk);
    kva_index_add(ix, h + 2, 4, 2, KVA_BIT_EVENT | CPU, &clk);
    kva_index_add(ix, h + 6, 2, 2, KVA_BIT_EVENT, &clk);
    ok(sound("tiers added"), "the index with tiers is sound");

    (void) match(h, 8, slots(1, 2));
    ok(depth[1] == 8 && tiers[1].n[0] == 0 && tiers[1].n[1] == 0,
       "GPU holder: 8 blocks, none slower");
    ok(depth[2] == 8 && tiers[2].n[0] == 4 && tiers[2].n[1] == 0,
       "the match goes on through host memory: 8 blocks, 4 in it (%u %u)",
       depth[2], tiers[2].n[0]);

    /* a prefix: only the blocks matched count */
    (void) match(h, 3, slots(1, 2));
    ok(depth[2] == 3 && tiers[2].n[0] == 1, "3 blocks: 1 in host memory");

    /* stored again on GPU: lifted */
    kva_index_add(ix, h + 2, 2, 2, KVA_BIT_EVENT, &clk);
    (void) match(h, 8, slots(1, 2));
    ok(tiers[2].n[0] == 2, "a store on GPU lifts the blocks it names");

    /* the bridge lowers one whose GPU copy went: to disk */
    kva_index_add(ix, h + 7, 1, 2, KVA_BIT_EVENT | DISK, &clk);
    (void) match(h, 8, slots(1, 2));
    ok(tiers[2].n[0] == 2 && tiers[2].n[1] == 1 && depth[2] == 8,
       "a store at a slower tier lowers it");

    kva_index_count(ix, &clk, counts);
    ok(counts[2].slow[0] == 2 && counts[2].slow[1] == 1
       && counts[2].entries[KVA_SRC_EVENT] == 8 && counts[1].slow[0] == 0,
       "status counts: 2 entries in host memory, 1 on disk");

    /* a guess counts as GPU: the request routed there computed it */
    kva_index_add(ix, h + 2, 2, 2, KVA_BIT_SPEC, &clk);
    (void) match(h, 8, slots(1, 2));
    ok(tiers[2].n[0] == 2, "a speculative bit on a GPU block changes nothing");

    kva_index_add(ix, h + 4, 2, 2, KVA_BIT_SPEC, &clk);
    (void) match(h, 8, slots(1, 2));
    ok(tiers[2].n[0] == 0 && tiers[2].n[1] == 1,
       "... and a block with one counts as GPU while it is young");

    clk.now += 20;
    kva_index_add(ix, h + 4, 1, 3, KVA_BIT_EVENT, &clk);
    (void) match(h, 8, slots(1, 2));
    ok(tiers[2].n[0] == 2 && sound("aged"),
       "aged out, the event copy's tier is back: kept through the aging");

    /* an event removal: the tier goes with the copy */
    kva_index_del(ix, h + 3, 1, 2, KVA_BIT_EVENT);
    (void) match(h, 8, slots(1, 2));
    ok(depth[2] == 3 && tiers[2].n[0] == 0,
       "a removal of the last copy ends the match there (%u)", depth[2]);

    kva_index_add(ix, h + 3, 1, 2, KVA_BIT_LEARNED, &clk);
    kva_slotset_del(&clk.precise, 2);
    (void) match(h, 4, slots(1, 2));
    ok(depth[2] == 0, "not precise: the event copies do not count");
    kva_slotset_add(&clk.precise, 2);
    kva_index_add(ix, h + 3, 1, 2, KVA_BIT_EVENT, &clk);
    kva_index_del(ix, h + 3, 1, 2, KVA_BIT_LEARNED);
    (void) match(h, 4, slots(1, 2));
    ok(depth[2] == 4 && tiers[2].n[0] == 0 && sound("relearned"),
       "a learned bit removed alone leaves the GPU copy");

    /* a seventh holder: the wide record keeps no tier (documented) */
    seven[0] = 0x7777;

    for (s = 0; s < 7; s++) {
        kva_index_add(ix, seven, 1, 10 + s, KVA_BIT_EVENT | CPU, &clk);
    }

    (void) match(seven, 1, slots(10, 16));
    ok(depth[10] == 1 && depth[16] == 1 && tiers[10].n[0] == 0,
       "wide: held, counted as GPU");

    kva_index_del(ix, seven, 1, 16, KVA_BIT_EVENT);
    (void) match(seven, 1, slots(10, 16));
    ok(depth[10] == 1 && depth[16] == 0 && tiers[10].n[0] == 0
       && sound("narrowed"), "back inline: GPU until a store says again");

    kva_index_add(ix, seven, 1, 10, KVA_BIT_EVENT | DISK, &clk);
    (void) match(seven, 1, slots(10, 16));
    ok(tiers[10].n[1] == 1, "inline again, a store sets its tier");

    /* a tier past the last one: the slowest, the index stays sound */
    kva_index_add(ix, seven, 1, 10, KVA_BIT_EVENT | kva_tier_srcs(3), &clk);
    (void) match(seven, 1, slots(10, 16));
    ok(tiers[10].n[1] == 1 && sound("tier 3"), "tier 3 is taken as disk");

    kva_index_del(ix, seven, 1, 10, KVA_BITS_ALL);
    kva_index_count(ix, &clk, counts);
    ok(counts[10].slow[1] == 0 && sound("cleared"),
       "the copy gone: nothing counted on disk");

    free(counts);
    free(region);

    return done_testing();
}
