/*
 * kv_aware core: the block index read whole, for status pages and tests:
 * per-slot counts and the consistency check.  Neither is on the routing
 * path; lookups, inserts and drops are kva_index.c.
 */

#include <stdio.h>
#include <string.h>

#include "kva_index.h"


static int kva_fail(char *err, size_t err_len, const char *why,
    uint32_t where);


const char  *const kva_src_names[] = {
    KVA_SRCS(KVA_LIST_NAME)
};


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
    int           s;
    uint32_t      idx, age;
    uint64_t      bits;
    kva_src_e     src;
    kva_entry_t  *e, *entries;

    if (to > ix->high_water) {
        to = ix->high_water;
    }

    entries = (kva_entry_t *) ((uint32_t *) (ix + 1) + ix->nbuckets);

    for (idx = from; idx < to; idx++) {
        e = &entries[idx];
        age = clk->now - e->stamp;

        for (src = KVA_SRC_EVENT; src < KVA_SRC_COUNT; src++) {
            bits = (src == KVA_SRC_LEARNED)
                   ? kva_index_learn_bits(ix, e->bits[src], e->stamp)
                   : e->bits[src];

            if ((src == KVA_SRC_LEARNED && age >= clk->ttl_learned)
                || (src == KVA_SRC_SPEC && age >= clk->ttl_spec))
            {
                continue;
            }

            while (bits) {
                s = __builtin_ctzll(bits);
                counts[s].entries[src]++;
                bits &= bits - 1;
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

            if ((e->bits[0] | e->bits[1] | e->bits[2]) == 0) {
                return kva_fail(err, err_len, "linked entry holds nothing",
                                idx);
            }

            idx = e->next;
        }

        linked += n;
    }

    /* entries holding something are as many as the linked ones: all linked */
    inuse = 0;

    for (idx = 0; idx < hw; idx++) {
        e = &entries[idx];
        inuse += (e->bits[0] | e->bits[1] | e->bits[2]) != 0;
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

        if ((e->bits[0] | e->bits[1] | e->bits[2]) != 0) {
            return kva_fail(err, err_len, "free entry holds bits", idx);
        }
    }

    if (ix->used + nfree != hw) {
        return kva_fail(err, err_len, "entries lost: used + free < hw",
                        hw - ix->used - nfree);
    }

    return 0;
}
