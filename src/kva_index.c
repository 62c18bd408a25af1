/*
 * kv_aware core: the block index.
 *
 * Chained hash table over a dense entry array.  Keys are XXH3 outputs, so
 * their low bits pick the bucket directly.  With buckets >= capacity / 2
 * chains stay short and a lookup costs the same at 10k or 1M entries.
 *
 * Eviction is sampled LRU (as Redis does): when full, the oldest of a few
 * neighbouring entries goes.  Exact LRU would need two more links per entry
 * and a relink, with writes to two neighbours, on every touch of a hot
 * prefix; sampling keeps entries at 40 bytes and touches read-mostly.
 */

#include <string.h>

#include "kva_index.h"


#define KVA_INDEX_MAGIC     0x6b766131u     /* "kva1" */
#define KVA_EVICT_SAMPLES   8


static uint32_t *kva_buckets(kva_index_t *ix);
static kva_entry_t *kva_entries(kva_index_t *ix);
static uint64_t kva_fresh_bits(const kva_entry_t *e, const kva_clock_t *clk);
static int kva_clear_bits(kva_entry_t *e, uint64_t mask, unsigned srcs);
static uint32_t kva_find(kva_index_t *ix, uint64_t key);
static void kva_unlink(kva_index_t *ix, uint32_t idx);
static void kva_release(kva_index_t *ix, uint32_t idx);
static uint32_t kva_alloc(kva_index_t *ix);
static uint32_t kva_evict(kva_index_t *ix);


static uint32_t *
kva_buckets(kva_index_t *ix)
{
    return (uint32_t *) (ix + 1);
}


static kva_entry_t *
kva_entries(kva_index_t *ix)
{
    return (kva_entry_t *) (kva_buckets(ix) + ix->nbuckets);
}


/* the largest power of two <= capacity / 2, and at least 2 */
static uint32_t
kva_nbuckets(uint32_t capacity)
{
    uint32_t  p;

    p = 2;

    while (p <= capacity / 4) {
        p <<= 1;
    }

    return p;
}


size_t
kva_index_region_size(uint32_t capacity)
{
    /* an even bucket count keeps the entries 8-byte aligned */
    return sizeof(kva_index_t) + (size_t) kva_nbuckets(capacity)
           * sizeof(uint32_t) + (size_t) capacity * sizeof(kva_entry_t);
}


uint32_t
kva_index_capacity_for(size_t region_size)
{
    uint32_t  lo, hi, mid;

    if (region_size < kva_index_region_size(1)) {
        return 0;
    }

    lo = 1;
    hi = (uint32_t) (region_size / sizeof(kva_entry_t) < KVA_NIL - 1
                     ? region_size / sizeof(kva_entry_t) : KVA_NIL - 1);

    while (lo < hi) {
        mid = lo + (hi - lo + 1) / 2;

        if (kva_index_region_size(mid) <= region_size) {
            lo = mid;

        } else {
            hi = mid - 1;
        }
    }

    return lo;
}


kva_index_t *
kva_index_init(void *region, size_t region_size, uint64_t secret)
{
    uint32_t      capacity, i;
    kva_index_t  *ix;

    capacity = kva_index_capacity_for(region_size);

    if (capacity == 0) {
        return NULL;
    }

    ix = region;

    memset(ix, 0, sizeof(kva_index_t));

    ix->capacity = capacity;
    ix->nbuckets = kva_nbuckets(capacity);
    ix->free_head = KVA_NIL;
    ix->secret = secret;

    for (i = 0; i < ix->nbuckets; i++) {
        kva_buckets(ix)[i] = KVA_NIL;
    }

    ix->magic = KVA_INDEX_MAGIC;

    return ix;
}


int
kva_index_valid(const kva_index_t *ix, size_t region_size)
{
    return ix->magic == KVA_INDEX_MAGIC
           && ix->capacity == kva_index_capacity_for(region_size);
}


static uint64_t
kva_fresh_bits(const kva_entry_t *e, const kva_clock_t *clk)
{
    uint32_t  age;
    uint64_t  bits;

    /* unsigned difference: correct across wrap of the tick counter */
    age = clk->now - e->stamp;

    bits = e->bits[KVA_SRC_EVENT] & clk->precise;

    if (age < clk->ttl_learned) {
        bits |= e->bits[KVA_SRC_LEARNED] & ~clk->precise;
    }

    if (age < clk->ttl_spec) {
        bits |= e->bits[KVA_SRC_SPEC];
    }

    return bits;
}


static uint32_t
kva_find(kva_index_t *ix, uint64_t key)
{
    uint32_t      idx;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    idx = kva_buckets(ix)[key & (ix->nbuckets - 1)];

    while (idx != KVA_NIL) {
        if (entries[idx].key == key) {
            return idx;
        }

        idx = entries[idx].next;
    }

    return KVA_NIL;
}


uint32_t
kva_index_match(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    uint64_t mask, const kva_clock_t *clk, uint32_t depth[KVA_MAX_SLOTS])
{
    return kva_index_match_found(ix, hashes, n, mask, clk, depth, NULL);
}


uint32_t
kva_index_match_found(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    uint64_t mask, const kva_clock_t *clk, uint32_t depth[KVA_MAX_SLOTS],
    uint32_t *found)
{
    int           slot;
    uint32_t      i, j, idx;
    uint64_t      alive, bits, gone;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    alive = mask;

    for (i = 0; i < n && alive; i++) {
        idx = kva_find(ix, hashes[i]);
        bits = (idx == KVA_NIL) ? 0 : kva_fresh_bits(&entries[idx], clk);

        if (found) {
            found[i] = idx;
        }

        /* a slot that misses block i cannot use any later block */
        gone = alive & ~bits;

        while (gone) {
            slot = __builtin_ctzll(gone);
            depth[slot] = i;
            gone &= gone - 1;
        }

        alive &= bits;
    }

    for (j = i; found && j < n; j++) {
        found[j] = KVA_NIL;
    }

    if (alive == 0) {
        /* depth of the last slots to drop out is their block number */
        return i ? i - 1 : 0;
    }

    while (alive) {
        slot = __builtin_ctzll(alive);
        depth[slot] = n;
        alive &= alive - 1;
    }

    return n;
}


static void
kva_unlink(kva_index_t *ix, uint32_t idx)
{
    uint32_t     *link;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    link = &kva_buckets(ix)[entries[idx].key & (ix->nbuckets - 1)];

    while (*link != idx) {
        link = &entries[*link].next;
    }

    *link = entries[idx].next;
}


static void
kva_release(kva_index_t *ix, uint32_t idx)
{
    kva_entry_t  *e;

    kva_unlink(ix, idx);

    e = &kva_entries(ix)[idx];
    memset(e, 0, sizeof(kva_entry_t));
    e->next = ix->free_head;
    ix->free_head = idx;
    ix->used--;
}


static uint32_t
kva_evict(kva_index_t *ix)
{
    uint32_t      i, idx, victim, oldest_age, age, now;
    kva_entry_t  *entries;

    /* the freshest stamp of the sample stands in for "now" */
    entries = kva_entries(ix);
    victim = ix->hand;
    now = entries[victim].stamp;

    for (i = 1; i < KVA_EVICT_SAMPLES; i++) {
        idx = (ix->hand + i) % ix->capacity;

        if ((int32_t) (entries[idx].stamp - now) > 0) {
            now = entries[idx].stamp;
        }
    }

    oldest_age = 0;

    for (i = 0; i < KVA_EVICT_SAMPLES; i++) {
        idx = (ix->hand + i) % ix->capacity;
        age = now - entries[idx].stamp;

        if (age >= oldest_age) {
            oldest_age = age;
            victim = idx;
        }
    }

    ix->hand = (ix->hand + KVA_EVICT_SAMPLES) % ix->capacity;
    ix->evictions++;

    kva_release(ix, victim);

    return kva_alloc(ix);
}


static uint32_t
kva_alloc(kva_index_t *ix)
{
    uint32_t  idx;

    if (ix->free_head != KVA_NIL) {
        idx = ix->free_head;
        ix->free_head = kva_entries(ix)[idx].next;
        ix->used++;
        return idx;
    }

    if (ix->high_water < ix->capacity) {
        ix->used++;
        return ix->high_water++;
    }

    return kva_evict(ix);
}


void
kva_index_add(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs, const kva_clock_t *clk)
{
    kva_index_add_found(ix, hashes, n, slot, srcs, clk, NULL);
}


void
kva_index_add_found(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs, const kva_clock_t *clk,
    const uint32_t *found)
{
    uint32_t      i, idx, age, *bucket;
    uint64_t      bit;
    kva_entry_t  *e, *entries;

    bit = 1ULL << slot;
    entries = kva_entries(ix);

    for (i = 0; i < n; i++) {
        idx = found ? found[i] : KVA_NIL;

        /* an eviction by this very loop may have reused the entry */
        if (idx == KVA_NIL || entries[idx].key != hashes[i]
            || (entries[idx].bits[0] | entries[idx].bits[1]
                | entries[idx].bits[2]) == 0)
        {
            idx = kva_find(ix, hashes[i]);
        }

        if (idx == KVA_NIL) {
            idx = kva_alloc(ix);
            e = &entries[idx];
            memset(e, 0, sizeof(kva_entry_t));
            e->key = hashes[i];

            bucket = &kva_buckets(ix)[hashes[i] & (ix->nbuckets - 1)];
            e->next = *bucket;
            *bucket = idx;
            ix->inserts++;

        } else {
            e = &entries[idx];

            /*
             * The stamp is shared by all slots of the entry: drop bits that
             * have aged out before the touch below would revive them.
             */
            age = clk->now - e->stamp;

            if (age >= clk->ttl_learned) {
                e->bits[KVA_SRC_LEARNED] = 0;
            }

            if (age >= clk->ttl_spec) {
                e->bits[KVA_SRC_SPEC] = 0;
            }
        }

        if (srcs & KVA_BIT_EVENT) {
            e->bits[KVA_SRC_EVENT] |= bit;
        }

        if (srcs & KVA_BIT_LEARNED) {
            e->bits[KVA_SRC_LEARNED] |= bit;
        }

        if (srcs & KVA_BIT_SPEC) {
            e->bits[KVA_SRC_SPEC] |= bit;
        }

        e->stamp = clk->now;
    }
}


/* returns 1 when the entry holds nothing any more */
static int
kva_clear_bits(kva_entry_t *e, uint64_t mask, unsigned srcs)
{
    kva_src_e  src;

    for (src = KVA_SRC_EVENT; src < KVA_SRC_COUNT; src++) {
        if (srcs & (1u << src)) {
            e->bits[src] &= ~mask;
        }
    }

    return (e->bits[0] | e->bits[1] | e->bits[2]) == 0;
}


void
kva_index_del(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs)
{
    uint32_t  i, idx;

    for (i = 0; i < n; i++) {
        idx = kva_find(ix, hashes[i]);

        if (idx != KVA_NIL
            && kva_clear_bits(&kva_entries(ix)[idx], 1ULL << slot, srcs))
        {
            kva_release(ix, idx);
        }
    }
}


void
kva_index_drop_slots(kva_index_t *ix, uint64_t mask, unsigned srcs)
{
    (void) kva_index_drop_range(ix, mask, srcs, 0, KVA_NIL);
}


uint32_t
kva_index_drop_range(kva_index_t *ix, uint64_t mask, unsigned srcs,
    uint32_t from, uint32_t to)
{
    uint32_t      idx;
    kva_entry_t  *e;

    if (to > ix->high_water) {
        to = ix->high_water;
    }

    for (idx = from; idx < to; idx++) {
        e = &kva_entries(ix)[idx];

        if ((e->bits[0] | e->bits[1] | e->bits[2]) == 0) {
            continue;   /* on the free list */
        }

        if (kva_clear_bits(e, mask, srcs)) {
            kva_release(ix, idx);
        }
    }

    return to > from ? to : ix->high_water;
}


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
    kva_entry_t  *e;
    kva_src_e     src;

    if (to > ix->high_water) {
        to = ix->high_water;
    }

    for (idx = from; idx < to; idx++) {
        e = &kva_entries(ix)[idx];
        age = clk->now - e->stamp;

        for (src = KVA_SRC_EVENT; src < KVA_SRC_COUNT; src++) {
            bits = e->bits[src];

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
