/*
 * kv_aware core: the index's own view of its region, shared by the files
 * of the index (kva_index.c, kva_index_holders.c, kva_index_scan.c) and by
 * nothing else.  The region is the header, the buckets, the entries, then
 * the wide records; an entry's holders are read here, written in
 * kva_index_holders.c.
 */

#ifndef _KVA_INDEX_INT_H_INCLUDED_
#define _KVA_INDEX_INT_H_INCLUDED_


#include "kva_index_layout.h"


static inline uint32_t *
kva_buckets(const kva_index_t *ix)
{
    return (uint32_t *) (ix + 1);
}


static inline kva_entry_t *
kva_entries(const kva_index_t *ix)
{
    return (kva_entry_t *) (kva_buckets(ix) + ix->nbuckets);
}


static inline kva_wide_t *
kva_wides(const kva_index_t *ix)
{
    return (kva_wide_t *) (kva_entries(ix) + ix->capacity);
}


/* the entry's wide record, NULL when inline (or the link is out of range) */
static inline kva_wide_t *
kva_wide_of(const kva_index_t *ix, const kva_entry_t *e)
{
    if (e->wide == 0 || e->wide - 1 >= ix->wide_hw) {
        return NULL;
    }

    return &kva_wides(ix)[e->wide - 1];
}


/*
 * Holder h with its sources now srcs (0: the place empties); its tier
 * stays while its event bit does, and goes with it.
 */
static inline kva_holder_t
kva_holder_with(kva_holder_t h, unsigned srcs)
{
    if (srcs == 0) {
        return 0;
    }

    h = (kva_holder_t) ((h & ~7u) | srcs);

    return (srcs & KVA_BIT_EVENT) ? h
                                  : (kva_holder_t) (h & KVA_HOLDER_UNTIERED);
}


/*
 * Holder h (0: a new one of slot) given srcs, whose bits past the sources
 * are the tier of an event copy (kva_tier_srcs()): an event sets the tier,
 * whatever it was, so that a store on GPU lifts a block an offload tier
 * held, and the bridge's store at a slower tier lowers it.
 */
static inline kva_holder_t
kva_holder_add(kva_holder_t h, unsigned slot, unsigned srcs)
{
    unsigned  tier;

    tier = srcs >> 3 & 3;
    tier = (tier > KVA_TIERS_SLOW) ? KVA_TIERS_SLOW : tier;
    srcs &= 7;

    if (h == 0) {
        h = kva_holder(slot, 0);
    }

    if (srcs & KVA_BIT_EVENT) {
        h = (kva_holder_t) ((h & KVA_HOLDER_UNTIERED)
                            | tier << KVA_HOLDER_TIER_SHIFT);
    }

    return (kva_holder_t) (h | srcs);
}


/* an empty holder is 0, so an entry holding nothing is zero past next */
static inline int
kva_entry_empty(const kva_entry_t *e)
{
    unsigned  i;

    if (e->wide) {
        return 0;
    }

    for (i = 0; i < KVA_INLINE; i++) {
        if (e->h[i]) {
            return 0;
        }
    }

    return 1;
}


/*
 * the sources of holder h that count now for block pos of a prompt (age:
 * of the entry)
 */
static inline unsigned
kva_holder_fresh(const kva_index_t *ix, kva_holder_t h, uint32_t age,
    uint32_t stamp, uint32_t pos, const kva_clock_t *clk)
{
    int       precise;
    unsigned  slot, srcs, fresh;

    slot = kva_holder_slot(h);
    srcs = kva_holder_srcs(h);
    precise = kva_slotset_has(&clk->precise, slot);
    fresh = 0;

    if ((srcs & KVA_BIT_EVENT) && precise) {
        fresh |= KVA_BIT_EVENT;
    }

    if ((srcs & KVA_BIT_LEARNED) && !precise && age < clk->ttl_learned
        && kva_index_learn_ok_at(ix, slot, stamp, pos))
    {
        fresh |= KVA_BIT_LEARNED;
    }

    if ((srcs & KVA_BIT_SPEC) && age < clk->ttl_spec) {
        fresh |= KVA_BIT_SPEC;
    }

    return fresh;
}


/*
 * Of the slots in want, those of word wi that a wide record holds and
 * that count now, at pos (want: a learned bit past its cutoff costs a
 * walk of the generations, for the slots still matching only)
 */
static inline uint64_t
kva_wide_fresh(const kva_index_t *ix, const kva_wide_t *w, unsigned wi,
    uint64_t want, uint32_t age, uint32_t stamp, uint32_t pos,
    const kva_clock_t *clk)
{
    uint64_t  bits;

    bits = w->bits[KVA_SRC_EVENT][wi] & clk->precise.w[wi];

    if (age < clk->ttl_learned) {
        bits |= kva_index_learn_bits(ix, wi, w->bits[KVA_SRC_LEARNED][wi]
                                             & ~clk->precise.w[wi] & want,
                                     stamp, pos);
    }

    if (age < clk->ttl_spec) {
        bits |= w->bits[KVA_SRC_SPEC][wi];
    }

    return bits & want;
}


/*
 * The common add, in one pass over an inline entry: ages its holders (as
 * kva_entry_age() does, for block pos of a prompt; budgets: whether any
 * slot's learned budget is in force), then adds srcs to slot's holder or
 * to an empty place.  Returns as kva_entry_set(), or 2 when the entry is
 * wide or full: the caller goes the long way.
 */
static inline int
kva_entry_touch(const kva_index_t *ix, kva_entry_t *e, unsigned slot,
    unsigned srcs, const kva_clock_t *clk, int budgets, uint32_t pos)
{
    int       learned, spec, anew, aging;
    unsigned  i, s, hs, mine, empty;
    uint32_t  age;

    if (e->wide) {
        return 2;
    }

    age = clk->now - e->stamp;
    learned = age < clk->ttl_learned;
    spec = age < clk->ttl_spec;
    mine = KVA_INLINE;
    empty = KVA_INLINE;

    /* a young entry, no budget in force: nothing to age, the usual case */
    aging = !learned || !spec || budgets;

    for (i = 0; i < KVA_INLINE; i++) {
        if (!aging) {
            if (e->h[i] && kva_holder_slot(e->h[i]) == slot) {
                mine = i;
                break;
            }

            if (e->h[i] == 0 && empty == KVA_INLINE) {
                empty = i;
            }

            continue;
        }

        if (e->h[i]) {
            s = kva_holder_slot(e->h[i]);
            hs = kva_holder_srcs(e->h[i]);

            if ((hs & KVA_BIT_LEARNED)
                && (!learned || !kva_index_learn_ok_at(ix, s, e->stamp, pos)))
            {
                hs &= ~KVA_BIT_LEARNED;
            }

            if (!spec) {
                hs &= ~KVA_BIT_SPEC;
            }

            e->h[i] = kva_holder_with(e->h[i], hs);

            if (hs && s == slot) {
                mine = i;
            }
        }

        if (e->h[i] == 0 && empty == KVA_INLINE) {
            empty = i;
        }
    }

    if (mine < KVA_INLINE) {
        anew = (srcs & KVA_BIT_LEARNED)
               && !(kva_holder_srcs(e->h[mine]) & KVA_BIT_LEARNED);
        e->h[mine] = kva_holder_add(e->h[mine], slot, srcs);
        return anew;
    }

    if (empty < KVA_INLINE) {
        e->h[empty] = kva_holder_add(0, slot, srcs);
        return (srcs & KVA_BIT_LEARNED) != 0;
    }

    return 2;
}


/* kva_index.c: frees an entry in use, its wide record with it */
void kva_index_release(kva_index_t *ix, uint32_t idx);

/* kva_index_holders.c */
int kva_entry_set(kva_index_t *ix, uint32_t idx, unsigned slot,
    unsigned srcs);
void kva_entry_age(kva_index_t *ix, kva_entry_t *e, const kva_clock_t *clk,
    uint32_t pos);
int kva_entry_clear(kva_index_t *ix, kva_entry_t *e, const kva_slotset_t *set,
    unsigned srcs);
void kva_wide_free(kva_index_t *ix, uint32_t r);


/*
 * A matched block of slot held by h: counted in tiers (NULL: not asked)
 * when only its event copy counts and that is in a slower tier.
 */
static inline void
kva_match_tier(kva_tier_count_t *tiers, kva_holder_t h, unsigned fresh,
    unsigned slot)
{
    unsigned  t;

    t = kva_holder_tier(h);

    if (tiers && t && fresh == KVA_BIT_EVENT && t <= KVA_TIERS_SLOW) {
        tiers[slot].n[t - 1]++;
    }
}


/*
 * The slots of live that hold block i (entry e, NULL: nobody) stay, as a
 * list when e is inline (at most KVA_INLINE of them), else as the set;
 * each other one leaves with depth i.  Returns how many are listed, or
 * KVA_MAX_SLOTS + 1 when they stay in the set (e is wide).  O(C) words
 * once: after an inline block the match goes on by the list.
 */
static inline unsigned
kva_match_set(kva_index_t *ix, const kva_entry_t *e, const kva_clock_t *clk,
    kva_slotset_t *live, uint16_t *list, uint32_t i,
    uint32_t depth[KVA_MAX_SLOTS], kva_tier_count_t *tiers)
{
    unsigned      k, n, slot, wi, fresh;
    uint32_t      age;
    uint64_t      gone, keep;
    kva_wide_t   *w;

    n = 0;
    w = NULL;

    if (e) {
        age = clk->now - e->stamp;
        w = kva_wide_of(ix, e);

        if (w) {
            for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
                if (live->w[wi] == 0) {
                    continue;
                }

                keep = live->w[wi] & kva_wide_fresh(ix, w, wi, live->w[wi],
                                                    age, e->stamp, i, clk);

                for (gone = live->w[wi] & ~keep; gone; gone &= gone - 1) {
                    depth[wi * 64 + __builtin_ctzll(gone)] = i;
                }

                live->w[wi] = keep;
            }

            return KVA_MAX_SLOTS + 1;
        }

        for (k = 0; k < KVA_INLINE; k++) {
            slot = kva_holder_slot(e->h[k]);

            if (e->h[k] == 0 || !kva_slotset_has(live, slot)) {
                continue;
            }

            fresh = kva_holder_fresh(ix, e->h[k], age, e->stamp, i, clk);

            if (fresh) {
                list[n++] = (uint16_t) slot;
                kva_slotset_del(live, slot);
                kva_match_tier(tiers, e->h[k], fresh, slot);
            }
        }
    }

    /* what is left in the set missed block i: a word at a time */
    for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
        for (gone = live->w[wi]; gone; gone &= gone - 1) {
            depth[wi * 64 + __builtin_ctzll(gone)] = i;
        }
    }

    return n;
}


/* the same for the n slots of list: returns how many stay */
static inline unsigned
kva_match_list(kva_index_t *ix, const kva_entry_t *e, const kva_clock_t *clk,
    uint16_t *list, unsigned n, uint32_t i, uint32_t depth[KVA_MAX_SLOTS],
    kva_tier_count_t *tiers)
{
    unsigned      j, k, kept, slot, fresh;
    uint32_t      age;
    kva_wide_t   *w;

    kept = 0;
    age = e ? clk->now - e->stamp : 0;
    w = e ? kva_wide_of(ix, e) : NULL;

    for (j = 0; j < n; j++) {
        slot = list[j];

        if (e == NULL) {
            k = KVA_INLINE;

        } else if (w) {
            k = (kva_wide_fresh(ix, w, slot / 64, 1ULL << (slot % 64),
                                age, e->stamp, i, clk)
                 >> (slot % 64) & 1) ? 0 : KVA_INLINE;

        } else {
            for (k = 0; k < KVA_INLINE; k++) {
                if (e->h[k] && kva_holder_slot(e->h[k]) == slot) {
                    fresh = kva_holder_fresh(ix, e->h[k], age, e->stamp,
                                             i, clk);
                    kva_match_tier(tiers, e->h[k], fresh, slot);
                    k = fresh ? k : KVA_INLINE;
                    break;
                }
            }
        }

        if (k < KVA_INLINE) {
            list[kept++] = (uint16_t) slot;

        } else {
            depth[slot] = i;
        }
    }

    return kept;
}


#endif /* _KVA_INDEX_INT_H_INCLUDED_ */
