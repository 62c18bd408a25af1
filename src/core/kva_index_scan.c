/*
 * kv_aware core: the block index read whole, for status pages and tests:
 * per-slot counts and the consistency check.  Neither is on the routing
 * path; lookups, inserts and drops are kva_index.c.
 */

#include <stdio.h>
#include <string.h>

#include "kva_index.h"
#include "kva_index_int.h"


static int kva_fail(char *err, size_t err_len, const char *why,
    uint32_t where);
static int kva_check_holders(const kva_index_t *ix, uint32_t idx);
static int kva_check_wides(const kva_index_t *ix, char *err, size_t err_len);


const char  *const kva_src_names[] = {
    KVA_SRCS(KVA_LIST_NAME)
};

const char  *const kva_tier_slow_names[] = { "cpu", "disk" };


void
kva_index_count(kva_index_t *ix, const kva_clock_t *clk,
    kva_slot_count_t counts[KVA_MAX_SLOTS])
{
    memset(counts, 0, sizeof(kva_slot_count_t) * KVA_MAX_SLOTS);

    (void) kva_index_count_range(ix, clk, 0, KVA_NIL, counts);
}


uint32_t
kva_index_count_range(kva_index_t *ix, const kva_clock_t *clk,
    uint32_t from, uint32_t to, kva_slot_count_t counts[KVA_MAX_SLOTS])
{
    unsigned      k, wi, slot, src, srcs, tier;
    uint32_t      idx, age;
    uint64_t      bits;
    kva_wide_t   *w;
    kva_entry_t  *e, *entries;

    if (to > ix->high_water) {
        to = ix->high_water;
    }

    entries = kva_entries(ix);

    for (idx = from; idx < to; idx++) {
        e = &entries[idx];
        age = clk->now - e->stamp;
        w = kva_wide_of(ix, e);

        if (w == NULL) {
            for (k = 0; k < KVA_INLINE; k++) {
                slot = kva_holder_slot(e->h[k]);
                srcs = kva_holder_srcs(e->h[k]);

                if (e->wide || slot >= KVA_MAX_SLOTS) {
                    break;
                }

                if ((srcs & KVA_BIT_LEARNED)
                    && (age >= clk->ttl_learned
                        || !kva_index_learn_ok(ix, slot, e->stamp)))
                {
                    srcs &= ~KVA_BIT_LEARNED;
                }

                if (age >= clk->ttl_spec) {
                    srcs &= ~KVA_BIT_SPEC;
                }

                for (src = 0; src < KVA_SRC_COUNT; src++) {
                    counts[slot].entries[src] += srcs >> src & 1;
                }

                tier = kva_holder_tier(e->h[k]);

                if ((srcs & KVA_BIT_EVENT) && tier
                    && tier <= KVA_TIERS_SLOW)
                {
                    counts[slot].slow[tier - 1]++;
                }
            }

            continue;
        }

        for (src = KVA_SRC_EVENT; src < KVA_SRC_COUNT; src++) {
            if ((src == KVA_SRC_LEARNED && age >= clk->ttl_learned)
                || (src == KVA_SRC_SPEC && age >= clk->ttl_spec))
            {
                continue;
            }

            for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
                bits = (src == KVA_SRC_LEARNED)
                       ? kva_index_learn_bits(ix, wi, w->bits[src][wi],
                                              e->stamp, KVA_NO_HEAD)
                       : w->bits[src][wi];

                for ( ; bits; bits &= bits - 1) {
                    counts[wi * 64 + __builtin_ctzll(bits)].entries[src]++;
                }
            }
        }
    }

    return to > from ? to : ix->high_water;
}


static int
kva_fail(char *err, size_t err_len, const char *why, uint32_t where)
{
    if (err_len) {
        (void) snprintf(err, err_len, "%s %u", why, where);
    }

    return -1;
}


int
kva_index_check(const kva_index_t *ix, char *err, size_t err_len)
{
    uint32_t            b, idx, n, linked, inuse, nfree, hw;
    const uint32_t     *buckets;
    const kva_entry_t  *entries, *e;

    if (ix->magic != KVA_INDEX_MAGIC) {
        return kva_fail(err, err_len, "bad magic", ix->magic);
    }

    hw = ix->high_water;

    if (hw > ix->capacity) {
        return kva_fail(err, err_len, "high_water past capacity", hw);
    }

    if (ix->nbuckets < 2 || (ix->nbuckets & (ix->nbuckets - 1))) {
        return kva_fail(err, err_len, "bucket count", ix->nbuckets);
    }

    buckets = (const uint32_t *) (ix + 1);
    entries = (const kva_entry_t *) (buckets + ix->nbuckets);

    /*
     * A chain that repeats an entry never ends, so one that ends within
     * the cap has distinct entries; and an entry in the bucket of its key
     * cannot be in another chain.  Hence each linked entry counts once.
     */
    linked = 0;

    for (b = 0; b < ix->nbuckets; b++) {
        idx = buckets[b];

        for (n = 0; idx != KVA_NIL; n++) {
            if (n == KVA_CHAIN_MAX) {
                return kva_fail(err, err_len,
                                "chain past the cap or cycle in bucket", b);
            }

            if (idx >= hw) {
                return kva_fail(err, err_len, "link out of range in bucket",
                                b);
            }

            e = &entries[idx];

            if (kva_index_bucket(ix, e->key) != b) {
                return kva_fail(err, err_len, "entry in a foreign bucket",
                                idx);
            }

            if (kva_entry_empty(e)) {
                return kva_fail(err, err_len, "linked entry holds nothing",
                                idx);
            }

            if (kva_check_holders(ix, idx) != 0) {
                return kva_fail(err, err_len, "bad holders in entry", idx);
            }

            idx = e->next;
        }

        linked += n;
    }

    /* entries holding something are as many as the linked ones: all linked */
    inuse = 0;

    for (idx = 0; idx < hw; idx++) {
        e = &entries[idx];
        inuse += !kva_entry_empty(e);
    }

    if (inuse != linked) {
        return kva_fail(err, err_len, "entries in use not linked", inuse
                                                                 - linked);
    }

    if (ix->used != linked) {
        return kva_fail(err, err_len, "used differs from linked", ix->used);
    }

    /* free entries hold nothing, so none of them is linked */
    nfree = 0;

    for (idx = ix->free_head; idx != KVA_NIL; idx = entries[idx].next) {
        if (idx >= hw) {
            return kva_fail(err, err_len, "free list out of range", idx);
        }

        if (++nfree > hw) {
            return kva_fail(err, err_len, "cycle in the free list", idx);
        }

        e = &entries[idx];

        if (!kva_entry_empty(e)) {
            return kva_fail(err, err_len, "free entry holds bits", idx);
        }
    }

    if (ix->used + nfree != hw) {
        return kva_fail(err, err_len, "entries lost: used + free < hw",
                        hw - ix->used - nfree);
    }

    return kva_check_wides(ix, err, err_len);
}


/*
 * An inline entry's holders are slots in range, each once; a wide one's
 * record is in range, owned by it, and holds more than KVA_INLINE slots
 * (fewer go back inline).
 */
static int
kva_check_holders(const kva_index_t *ix, uint32_t idx)
{
    unsigned            i, j, wi, n;
    const kva_wide_t   *w;
    const kva_entry_t  *e;

    e = &kva_entries(ix)[idx];

    if (e->wide) {
        w = kva_wide_of(ix, e);

        if (w == NULL || w->owner != idx) {
            return -1;
        }

        n = 0;

        for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
            n += (unsigned) __builtin_popcountll(w->bits[0][wi]
                                                 | w->bits[1][wi]
                                                 | w->bits[2][wi]);
        }

        return n > KVA_INLINE ? 0 : -1;
    }

    for (i = 0; i < KVA_INLINE; i++) {
        if (e->h[i] == 0) {
            continue;
        }

        /* a tier is the event copy's: none without it, and 3 is none */
        if (kva_holder_slot(e->h[i]) >= KVA_MAX_SLOTS
            || kva_holder_srcs(e->h[i]) == 0
            || kva_holder_tier(e->h[i]) > KVA_TIERS_SLOW
            || (kva_holder_tier(e->h[i])
                && !(kva_holder_srcs(e->h[i]) & KVA_BIT_EVENT)))
        {
            return -1;
        }

        for (j = 0; j < i; j++) {
            if (e->h[j] && kva_holder_slot(e->h[j])
                           == kva_holder_slot(e->h[i]))
            {
                return -1;
            }
        }
    }

    return 0;
}


/* the wide pool: records handed out are those linked, the rest free */
static int
kva_check_wides(const kva_index_t *ix, char *err, size_t err_len)
{
    uint32_t            r, owned, nfree;
    const kva_wide_t   *wides;
    const kva_entry_t  *entries;

    if (ix->wide_hw > ix->nwide || ix->wide_used > ix->wide_hw) {
        return kva_fail(err, err_len, "wide records past the pool",
                        ix->wide_hw);
    }

    wides = kva_wides(ix);
    entries = kva_entries(ix);
    owned = 0;

    for (r = 0; r < ix->wide_hw; r++) {
        if (wides[r].owner < ix->high_water
            && entries[wides[r].owner].wide == r + 1)
        {
            owned++;
        }
    }

    if (owned != ix->wide_used) {
        return kva_fail(err, err_len, "wide records in use not owned",
                        ix->wide_used - owned);
    }

    nfree = 0;

    for (r = ix->wide_free; r != KVA_NIL; r = wides[r].next) {
        if (r >= ix->wide_hw || wides[r].owner != KVA_NIL) {
            return kva_fail(err, err_len, "bad wide free list", r);
        }

        if (++nfree > ix->wide_hw) {
            return kva_fail(err, err_len, "cycle in the wide free list", r);
        }
    }

    if (owned + nfree != ix->wide_hw) {
        return kva_fail(err, err_len, "wide records lost",
                        ix->wide_hw - owned - nfree);
    }

    return 0;
}
