/*
 * libFuzzer target for the block index (src/core/kva_index.c).
 *
 * The input is a program: a few bytes choose the capacity, then each
 * operation is an opcode and its arguments (add, match, the balancer's
 * match_found + add_found, del, drop_range and count_range in chunks,
 * clock and trust changes).  Keys come from a table of 48: 20 that share
 * one bucket (more than KVA_CHAIN_MAX) and 28 others, so keys repeat,
 * collide, fill chains to the cap, and a capacity of 16 to 271 entries
 * keeps eviction busy.  After every operation kva_index_check must pass,
 * and a few facts that are cheap to know must hold.
 *
 * One more operation damages the index as a worker killed with the lock
 * held could, and worse (an entry allocated but not linked, links and
 * bucket heads pointing anywhere, an entry in use on the free list).  From
 * then on nothing is checked but that every operation returns: the
 * sanitizers and libFuzzer's -timeout catch a bad read or a loop.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kva_index.h"
#include "kva_rand.h"


#define NKEYS       48
#define NCHAINED    20
#define MAXN        16


typedef struct {
    const uint8_t  *p;
    size_t          left;
} fz_in_t;


static uint8_t
fz_byte(fz_in_t *in)
{
    if (in->left == 0) {
        return 0;
    }

    in->left--;

    return *in->p++;
}


/*
 * The same match in one piece, with tiers: the same depths, and no slot
 * with more blocks in slower tiers than it matched.
 */

static void
fz_match_tiers(kva_index_t *ix, const uint64_t *k, uint32_t n,
    const kva_slotset_t *mask, const kva_clock_t *clk,
    const uint32_t *want)
{
    unsigned          slot;
    uint32_t          reached, depth[KVA_MAX_SLOTS];
    kva_slotset_t     alive;
    kva_tier_count_t  tiers[KVA_MAX_SLOTS];

    memset(tiers, 0, sizeof(tiers));
    alive = *mask;
    reached = kva_index_match_part(ix, k, 0, n, &alive, clk, depth, NULL,
                                   tiers);
    (void) kva_index_match_done(n, reached, &alive, depth, NULL);

    for (slot = 0; slot < 8; slot++) {
        if (kva_slotset_has(mask, slot)
            && (depth[slot] != want[slot]
                || tiers[slot].n[0] + tiers[slot].n[1] > depth[slot]))
        {
            fprintf(stderr, "slot %u: tiers %u + %u of %u\n", slot,
                    tiers[slot].n[0], tiers[slot].n[1], depth[slot]);
            abort();
        }
    }
}


/* random-looking keys from counters: splitmix64's draw from state x */

static uint64_t
fz_mix(uint64_t x)
{
    return kva_rand_next(&x);
}


static int  fz_damaged;


static void
fz_check(kva_index_t *ix, const char *op)
{
    char  err[128];

    if (fz_damaged) {
        return;
    }

    if (kva_index_check(ix, err, sizeof(err)) != 0) {
        fprintf(stderr, "kva_index_check after %s: %s\n", op, err);
        abort();
    }

    if (ix->used > ix->capacity) {
        fprintf(stderr, "used %u > capacity %u after %s\n", ix->used,
                ix->capacity, op);
        abort();
    }
}


static void
fz_damage(kva_index_t *ix, fz_in_t *in, const uint64_t *tab)
{
    uint32_t      *buckets, idx, v;
    kva_entry_t   *entries, *e;

    buckets = (uint32_t *) (ix + 1);
    entries = (kva_entry_t *) (buckets + ix->nbuckets);
    v = fz_byte(in);
    v = v << 8 | fz_byte(in);
    fz_damaged = 1;

    switch (fz_byte(in) % 5) {

    case 0:
        /* allocated, key set, maybe half linked, never linked */
        if (ix->high_water < ix->capacity) {
            e = &entries[ix->high_water++];
            ix->used++;
            memset(e, 0, sizeof(kva_entry_t));
            e->key = tab[v % NKEYS];
            e->h[v % KVA_INLINE] = (v & 0x100)
                                   ? kva_holder(v % 8, 1u << (v % 3)) : 0;
            e->wide = (v & 0x200) ? (v >> 10) : 0;  /* maybe out of range */
            e->next = buckets[kva_index_bucket(ix, e->key)];
        }
        break;

    case 1:
        /* taken off the free list, lost */
        if (ix->free_head < ix->high_water) {
            ix->free_head = entries[ix->free_head].next;
            ix->used++;
        }
        break;

    case 2:
        /* a link to anywhere: another entry (a cycle), or out of range */
        if (ix->high_water) {
            idx = v % ix->high_water;
            entries[idx].next = (v & 1) ? (v >> 1) % (ix->high_water + 2)
                                        : 0xfffffff0u;
        }
        break;

    case 3:
        buckets[v % ix->nbuckets] = (v & 1) ? (v >> 1) % (ix->capacity + 2)
                                            : KVA_NIL - 1;
        break;

    default:
        /* an entry in use pushed on the free list as well */
        if (ix->high_water) {
            idx = v % ix->high_water;
            entries[idx].next = ix->free_head;
            ix->free_head = idx;
        }
        break;
    }
}


static uint32_t
fz_keys(fz_in_t *in, const uint64_t *tab, uint64_t *k)
{
    uint32_t  i, n;

    n = fz_byte(in) % MAXN + 1;

    for (i = 0; i < n; i++) {
        k[i] = tab[fz_byte(in) % NKEYS];
    }

    return n;
}


/* the slots of a 64-bit mask, or one slot, as a slot set */
static const kva_slotset_t *
fz_set(kva_slotset_t *s, uint64_t mask)
{
    kva_slotset_zero(s);
    s->w[0] = mask;

    return s;
}


static const kva_slotset_t *
fz_one(kva_slotset_t *s, unsigned slot)
{
    kva_slotset_zero(s);
    kva_slotset_add(s, slot);

    return s;
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void              *region;
    size_t             rsize;
    uint8_t            op;
    uint32_t           cap, i, n, slot, srcs, from, chunk, before, evicted;
    uint32_t           depth[KVA_MAX_SLOTS], found[MAXN];
    uint64_t           tab[NKEYS], k[MAXN], x, mask, secret;
    kva_slotset_t      one, set;
    fz_in_t            in;
    kva_clock_t        clk = { 1000, 50, 10, {{ ~0ULL }} };
    kva_index_t       *ix;
    kva_slot_count_t   counts[KVA_MAX_SLOTS];

    in.p = data;
    in.left = size;
    fz_damaged = 0;

    cap = 16 + fz_byte(&in);
    secret = fz_mix(fz_byte(&in));
    rsize = kva_index_region_size(cap);

    region = malloc(rsize);
    if (region == NULL) {
        return 0;
    }

    /* garbage past high_water must never be read as entries */
    memset(region, 0xa5, rsize);

    ix = kva_index_init(region, rsize, secret);
    if (ix == NULL || ix->capacity != cap) {
        abort();
    }

    /* keys of one bucket, as only the secret allows, then random ones */
    for (i = 0, x = 1; i < NCHAINED; x++) {
        if (kva_index_bucket(ix, fz_mix(x)) == 0) {
            tab[i++] = fz_mix(x);
        }
    }

    for (i = NCHAINED; i < NKEYS; i++) {
        tab[i] = fz_mix(x + i);
    }

    while (in.left) {
        op = fz_byte(&in);

        switch (op % 10) {

        case 0:
            /* a stored event: each key then visible to a precise lookup */
            n = fz_keys(&in, tab, k);
            slot = fz_byte(&in) % 8;
            srcs = fz_byte(&in) % 32;      /* and a tier, 3 clamped */
            evicted = (uint32_t) (ix->evictions + ix->chain_evictions);

            kva_index_add(ix, k, n, slot, srcs, &clk);
            fz_check(ix, "add");

            if (!fz_damaged && (srcs & KVA_BIT_EVENT)
                && kva_slotset_has(&clk.precise, slot)
                && evicted == ix->evictions + ix->chain_evictions)
            {
                for (i = 0; i < n; i++) {
                    kva_index_match(ix, &k[i], 1, fz_one(&one, slot), &clk,
                                    depth);

                    if (depth[slot] != 1) {
                        fprintf(stderr, "key %u added, not found\n", i);
                        abort();
                    }
                }
            }

            break;

        case 1:
            n = fz_keys(&in, tab, k);
            mask = fz_byte(&in);
            before = kva_index_match(ix, k, n, fz_set(&set, mask), &clk,
                                     depth);

            for (slot = 0; slot < 8; slot++) {
                if ((mask >> slot & 1) && depth[slot] > before) {
                    abort();
                }
            }

            if (!fz_damaged) {
                fz_match_tiers(ix, k, n, fz_set(&set, mask), &clk, depth);
            }

            fz_check(ix, "match");
            break;

        case 2:
            /* the balancer: lookup and record under one hold */
            n = fz_keys(&in, tab, k);
            slot = fz_byte(&in) % 8;
            kva_index_match_found(ix, k, n, fz_set(&set, 0xff), &clk, depth,
                                  found);
            kva_index_add_found(ix, k, n, slot, KVA_BIT_LEARNED, &clk, found);
            fz_check(ix, "match_found + add_found");
            break;

        case 3:
            /* removed from every source: a precise lookup misses it */
            n = fz_keys(&in, tab, k);
            slot = fz_byte(&in) % 8;
            srcs = fz_byte(&in) % 8;
            kva_index_del(ix, k, n, slot, srcs);
            fz_check(ix, "del");

            if (!fz_damaged && srcs == KVA_BITS_ALL) {
                for (i = 0; i < n; i++) {
                    kva_index_match(ix, &k[i], 1, fz_one(&one, slot), &clk,
                                    depth);

                    if (depth[slot] != 0) {
                        fprintf(stderr, "key %u removed, still found\n", i);
                        abort();
                    }
                }
            }

            break;

        case 4:
            mask = fz_byte(&in);
            srcs = fz_byte(&in) % 8;
            chunk = fz_byte(&in) % 64 + 1;

            for (from = 0; from < ix->high_water; ) {
                from = kva_index_drop_range(ix, fz_set(&set, mask), srcs, from,
                                            from + chunk);
                fz_check(ix, "drop_range");
            }

            break;

        case 5:
            memset(counts, 0, sizeof(counts));
            chunk = fz_byte(&in) % 64 + 1;

            for (from = 0; from < ix->high_water; ) {
                from = kva_index_count_range(ix, &clk, from, from + chunk,
                                             counts);
            }

            for (slot = 0, n = 0; slot < KVA_MAX_SLOTS; slot++) {
                n += (uint32_t) counts[slot].entries[KVA_SRC_EVENT];
            }

            /* an entry holds at most 8 slots' event bits here */
            if (!fz_damaged && n > ix->used * 8) {
                abort();
            }

            fz_check(ix, "count_range");
            break;

        case 6:
            clk.now += fz_byte(&in);
            break;

        case 7:
            clk.precise.w[0] = fz_byte(&in) | ~0xffULL;
            break;

        case 8:
            clk.ttl_learned = fz_byte(&in);
            clk.ttl_spec = fz_byte(&in) % 32;
            break;

        default:
            fz_damage(ix, &in, tab);
            break;
        }
    }

    fz_check(ix, "end");
    free(region);

    return 0;
}
