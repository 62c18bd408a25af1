/*
 * Unit tests of a block's holders (src/core/kva_index_holders.c): six in
 * the entry, more in a wide record, back inline below seven, the wide
 * pool full, clears over both, and what a worker dying mid-add leaves.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_index.h"
#include "kva_index_int.h"
#include "kva_rand.h"


#define SLOTS   (KVA_MAX_SLOTS < 64 ? KVA_MAX_SLOTS : 64)
#define KEYS    64


static kva_slotset_t *
one(unsigned slot)
{
    static kva_slotset_t  set;

    kva_slotset_zero(&set);
    kva_slotset_add(&set, slot);

    return &set;
}


static kva_slotset_t *
all(void)
{
    static kva_slotset_t  set;
    unsigned              s;

    kva_slotset_zero(&set);

    for (s = 0; s < KVA_MAX_SLOTS; s++) {
        kva_slotset_add(&set, s);
    }

    return &set;
}


static int
sound(kva_index_t *ix, const char *what)
{
    char  err[128];

    if (kva_index_check(ix, err, sizeof(err)) == 0) {
        return 1;
    }

    printf("# %s: %s\n", what, err);

    return 0;
}


static kva_index_t *
fresh(uint32_t cap)
{
    size_t  size;

    size = kva_index_region_size(cap);

    return kva_index_init(calloc(1, size), size, 0x1234567);
}


/* whether slot holds key, by a lookup as the balancer makes it */
static int
holds(kva_index_t *ix, uint64_t key, unsigned slot, const kva_clock_t *clk)
{
    uint32_t  depth[KVA_MAX_SLOTS];

    depth[slot] = 7;
    kva_index_match(ix, &key, 1, one(slot), clk, depth);

    return depth[slot] == 1;
}


static kva_entry_t *
entry_of(kva_index_t *ix, uint64_t key)
{
    uint32_t  idx;

    for (idx = kva_buckets(ix)[kva_index_bucket(ix, key)];
         idx != KVA_NIL; idx = kva_entries(ix)[idx].next)
    {
        if (kva_entries(ix)[idx].key == key) {
            return &kva_entries(ix)[idx];
        }
    }

    return NULL;
}


static void
test_widen_narrow(void)
{
    unsigned      s, n;
    uint32_t      depth[KVA_MAX_SLOTS];
    uint64_t      k[4] = { 11, 12, 13, 14 };
    kva_clock_t   clk = { 1000, 100, 10, {{ 0 }} };
    kva_index_t  *ix;
    kva_entry_t  *e;

    clk.precise = *all();
    ix = fresh(1000);

    for (s = 0; s < 6; s++) {
        kva_index_add(ix, k, 4, s * 9, KVA_BIT_EVENT, &clk);
    }

    e = entry_of(ix, k[0]);
    ok(e && e->wide == 0 && ix->wide_used == 0,
       "six holders stay in the entry");

    kva_index_add(ix, k, 4, 60, KVA_BIT_EVENT, &clk);
    e = entry_of(ix, k[0]);
    ok(e && e->wide && ix->wide_used == 4, "the seventh takes a wide record "
       "a block (%u in use)", ix->wide_used);

    for (n = 0, s = 0; s < 6; s++) {
        depth[s * 9] = 0;
    }

    depth[60] = 0;
    kva_index_match(ix, k, 4, all(), &clk, depth);

    for (n = 0, s = 0; s < 6; s++) {
        n += depth[s * 9] == 4;
    }

    ok(n == 6 && depth[60] == 4 && depth[1] == 0,
       "all seven match the 4 blocks through the record, no other slot");
    ok(sound(ix, "wide"), "the index is sound with wide blocks");

    kva_index_del(ix, k, 4, 18, KVA_BIT_EVENT);
    e = entry_of(ix, k[0]);
    ok(e && e->wide == 0 && ix->wide_used == 0,
       "a removal leaving six moves them back inline");
    ok(!holds(ix, k[2], 18, &clk) && holds(ix, k[2], 60, &clk)
       && holds(ix, k[2], 0, &clk), "the six still hold it, the seventh not");
    ok(sound(ix, "narrowed"), "sound after going back inline");

    /* the same through a clear of a slot over the whole index */
    kva_index_add(ix, k, 4, 33, KVA_BIT_LEARNED, &clk);
    ok(ix->wide_used == 4, "a learned holder widens too");
    kva_index_drop_slots(ix, one(33), KVA_BITS_ALL);
    ok(ix->wide_used == 0 && !holds(ix, k[1], 33, &clk)
       && holds(ix, k[1], 9, &clk), "a clear of one slot narrows them");

    /* a source at a time: the event bit goes, the learned one stays */
    kva_index_add(ix, k, 1, 9, KVA_BIT_LEARNED, &clk);
    kva_index_drop_slots(ix, one(9), KVA_BIT_EVENT);
    clk.precise = *one(0);
    ok(holds(ix, k[0], 9, &clk), "what another source says stays");
    clk.precise = *all();
    ok(!holds(ix, k[0], 9, &clk), "and a precise slot trusts events only");

    kva_index_drop_slots(ix, all(), KVA_BITS_ALL);
    ok(ix->used == 0 && ix->wide_used == 0 && sound(ix, "cleared"),
       "a clear of every slot frees entries and records");

    free(ix);
}


static void
test_pool_full(void)
{
    unsigned      s;
    uint32_t      b, nwide;
    uint64_t      key;
    kva_clock_t   clk = { 1000, 1000, 10, {{ 0 }} };
    kva_index_t  *ix;

    clk.precise = *all();
    ix = fresh(1000);
    nwide = ix->nwide;

    ok(nwide == KVA_WIDE_MIN, "a small index has %u wide records", nwide);

    /* twice the pool's blocks, each held by 8 slots, one tick apart */
    for (b = 0; b < 2 * nwide; b++) {
        key = 1000 + b;
        clk.now++;

        for (s = 0; s < 8; s++) {
            kva_index_add(ix, &key, 1, s, KVA_BIT_EVENT, &clk);
        }
    }

    ok(ix->wide_used == nwide && ix->wide_evictions >= nwide,
       "the pool stays full: %u used, %llu blocks evicted", ix->wide_used,
       (unsigned long long) ix->wide_evictions);
    ok(sound(ix, "pool full"), "sound with the pool full");

    key = 1000 + 2 * nwide - 1;
    ok(holds(ix, key, 0, &clk) && holds(ix, key, 7, &clk),
       "the newest wide block is whole");

    key = 1000;
    ok(entry_of(ix, key) == NULL, "the oldest went, whole");

    free(ix);
}


static void
test_crash(void)
{
    char          err[128];
    unsigned      s;
    uint32_t      b;
    uint64_t      key;
    kva_clock_t   clk = { 1000, 1000, 10, {{ 0 }} };
    kva_index_t  *ix;
    kva_entry_t  *e;
    kva_wide_t   *w;

    clk.precise = *all();
    ix = fresh(1000);

    /* a record handed out, never linked: a kill inside the widening */
    ix->wide_hw = 1;
    ix->wide_used = 1;
    kva_wides(ix)[0].owner = KVA_NIL;

    ok(kva_index_check(ix, err, sizeof(err)) == -1,
       "check sees the lost record: %s", err);

    for (b = 0; b < ix->nwide; b++) {
        key = 5000 + b;
        clk.now++;

        for (s = 0; s < 7; s++) {
            kva_index_add(ix, &key, 1, s, KVA_BIT_EVENT, &clk);
        }
    }

    ok(ix->wide_evictions == 0 && sound(ix, "reclaimed"),
       "the sampler takes it again before evicting anybody");

    /* killed after linking the record, before emptying the holders */
    e = entry_of(ix, 5000);
    e->h[0] = kva_holder(40, KVA_BIT_EVENT);
    ok(!holds(ix, 5000, 40, &clk) && holds(ix, 5000, 3, &clk),
       "a linked record is what the entry holds");

    w = kva_wide_of(ix, e);
    key = 5000;
    kva_index_del(ix, &key, 1, 0, KVA_BIT_EVENT);
    ok(w && e->wide == 0 && !holds(ix, 5000, 40, &clk)
       && holds(ix, 5000, 6, &clk), "going inline rewrites the holders");
    ok(sound(ix, "half widened"), "and the index is sound");

    /* a wide link out of range: the entry is read as inline, then fixed */
    e->wide = 9999;
    ok(holds(ix, 5000, 6, &clk), "a link out of range reads as inline");
    kva_index_add(ix, &key, 1, 6, KVA_BIT_LEARNED, &clk);
    ok(e->wide == 0 && sound(ix, "bad link"), "and the next add mends it");

    free(ix);
}


/* random adds, deletes and clears against a plain bitmap per key */
static void
test_model(void)
{
    int           bad;
    unsigned      op, s, i, j, src;
    uint64_t      keys[KEYS], model[KEYS][3], rnd, x;
    kva_clock_t   clk = { 1000, 1u << 30, 1u << 30, {{ 0 }} };
    kva_index_t  *ix;

    memset(model, 0, sizeof(model));
    ix = fresh(8192);
    rnd = 42;
    bad = 0;

    for (i = 0; i < KEYS; i++) {
        keys[i] = kva_rand_next(&rnd);
    }

    for (op = 0; op < 20000 && !bad; op++) {
        x = kva_rand_next(&rnd);
        s = (unsigned) (x >> 8) % SLOTS;
        i = (unsigned) (x >> 16) % KEYS;
        src = (unsigned) (x >> 24) % 3;

        /* slots crowd onto few keys, so that many blocks go wide */
        if ((x & 7) < 5) {
            kva_index_add(ix, &keys[i], 1, s, 1u << src, &clk);
            model[i][src] |= 1ULL << s;

        } else if ((x & 7) < 7) {
            kva_index_del(ix, &keys[i], 1, s, 1u << src);
            model[i][src] &= ~(1ULL << s);

        } else if ((x >> 40) % 16 == 0) {
            kva_index_drop_slots(ix, one(s), 1u << src);

            for (j = 0; j < KEYS; j++) {
                model[j][src] &= ~(1ULL << s);
            }
        }

        if (op % 1000 != 999) {
            continue;
        }

        for (j = 0; j < KEYS && !bad; j++) {
            for (s = 0; s < SLOTS && !bad; s++) {
                /* precise: events count; not precise: learned ones */
                kva_slotset_zero(&clk.precise);
                bad |= holds(ix, keys[j], s, &clk)
                       != (int) ((model[j][1] | model[j][2]) >> s & 1);
                clk.precise = *all();
                bad |= holds(ix, keys[j], s, &clk)
                       != (int) ((model[j][0] | model[j][2]) >> s & 1);
            }
        }

        bad |= !sound(ix, "model");
    }

    ok(!bad, "20,000 random operations agree with a bitmap model "
       "(%u wide blocks at the end)", ix->wide_used);

    free(ix);
}


int
main(void)
{
    ok(sizeof(kva_entry_t) == 32, "an entry is 32 bytes");

    test_widen_narrow();
    test_pool_full();
    test_crash();
    test_model();

    return done_testing();
}
