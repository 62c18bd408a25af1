/*
 * kv_aware core: the block index.
 *
 * Chained hash table over a dense entry array.  With buckets >= capacity / 4
 * chains stay short and a lookup costs the same at 10k or 1M entries.
 *
 * Keys come from outside (prompt bytes a client chose, hashes a publisher
 * sent), so the bucket is not the key's low bits, which anyone can make
 * equal, but a universal hash of the key under a per-index secret (see
 * kva_index_bucket).  And whatever the keys, no chain holds more than
 * KVA_CHAIN_MAX entries.
 *
 * Eviction is sampled LRU (as Redis does): when full, the oldest of a few
 * neighbouring entries goes.  Exact LRU would need two more links per entry
 * and a relink, with writes to two neighbours, on every touch of a hot
 * prefix; sampling keeps entries at 32 bytes and touches read-mostly.
 *
 * What an entry holds is its holders (kva_index_holders.c writes them):
 * a lookup follows the slots still matching through each block's holders,
 * so its cost grows with how many servers hold a block, not with how many
 * there are.
 *
 * A worker can die anywhere in here with the lock held (nginx then frees
 * the lock), leaving an entry allocated but unlinked, a chain cut, or
 * worse.  So every walk is bounded and checks each link: a broken chain is
 * cut where it breaks, an entry found nowhere is simply freed, and a damaged
 * index routes a little worse instead of crashing or looping.
 */

#include <string.h>

#include "kva_index.h"
#include "kva_index_int.h"


#define KVA_EVICT_SAMPLES   8

/*
 * A prompt's probes do not depend on one another, but each waits on two
 * loads from a large table (its bucket, then the entry), out of cache
 * more often than not: the body's copies through the worker evict them.
 * So a lookup first prefetches the buckets of the next KVA_PRIME hashes
 * (all of a balancer's piece), then, while it probes hash i, the first
 * entry of hash i + KVA_AHEAD, whose bucket has arrived meanwhile: the
 * waits overlap instead of adding up.  With the buckets fetched 8 hashes
 * ahead only, it was slower than no prefetch at all.
 */
#define KVA_PRIME           KVA_ADD_CHUNK
#define KVA_AHEAD           4


static uint32_t kva_nwide(uint32_t capacity);
static uint32_t kva_find(kva_index_t *ix, uint64_t key, uint32_t *len);
static void kva_prefetch(kva_index_t *ix, const uint64_t *hashes,
    uint32_t i, uint32_t to);
static void kva_prefetch_add(kva_index_t *ix, const uint64_t *hashes,
    uint32_t i, uint32_t n, const uint32_t *found);
static int kva_unlink(kva_index_t *ix, uint32_t idx);
static void kva_evict_chain(kva_index_t *ix, uint32_t bucket, uint32_t now);
static uint32_t kva_alloc(kva_index_t *ix);
static uint32_t kva_evict(kva_index_t *ix);


/*
 * Multiply-shift under a random odd multiplier (Dietzfelbinger et al.),
 * folded and multiplied again.  Multiply-shift alone bounds each pair of
 * keys at 2 / nbuckets over the secret, but not how a structured set of
 * keys spreads under one secret: arithmetic progressions (ids 1, 2, 3,
 * or (message << 32) + i, as t/45 publishes) piled into a fraction of
 * the buckets for about 1 secret in 30, and the chain cap then evicted
 * up to 30% of 928,000 such keys from an index of 921,005 entries
 * (100 secrets simulated; most likely why t/45 once found its index 61%
 * full).  The fold brings the product's high bits down, where the
 * second multiply spreads them over the top bits the shift keeps:
 * under 60 secrets at most 0.04% past the cap, as for random keys;
 * the second multiply costs 2% of a cold lookup (bench_index_cold),
 * nothing measurable in routing (bench_route).  SipHash, a PRF, would
 * also resist an attacker timing lookups to learn the secret, but it
 * cost 17% of routing at 128k tokens (XXH3 with a seed: 12%, and it is
 * no PRF either).  Whatever an attacker learns, the cap on chains
 * bounds a lookup at KVA_CHAIN_MAX probes.
 */
static inline uint32_t
kva_bucket(const kva_index_t *ix, uint64_t key)
{
    uint64_t  h;

    h = (key ^ ix->bucket_key[0]) * ix->bucket_key[1];
    h ^= h >> 32;

    return (uint32_t) ((h * ix->bucket_key[1]) >> ix->bucket_shift);
}


/* the same for callers outside: inside, kva_bucket() is inlined */
uint32_t
kva_index_bucket(const kva_index_t *ix, uint64_t key)
{
    return kva_bucket(ix, key);
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


/* a wide record for KVA_WIDE_SHARE entries: never fewer as capacity grows */
static uint32_t
kva_nwide(uint32_t capacity)
{
    return capacity / KVA_WIDE_SHARE > KVA_WIDE_MIN
           ? capacity / KVA_WIDE_SHARE : KVA_WIDE_MIN;
}


size_t
kva_index_region_size(uint32_t capacity)
{
    /* an even bucket count keeps the entries 8-byte aligned */
    return sizeof(kva_index_t) + (size_t) kva_nbuckets(capacity)
           * sizeof(uint32_t) + (size_t) capacity * sizeof(kva_entry_t)
           + (size_t) kva_nwide(capacity) * sizeof(kva_wide_t);
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
    ix->nwide = kva_nwide(capacity);
    ix->wide_free = KVA_NIL;

    /* the multiplier odd, the shift keeping log2(nbuckets) top bits */
    ix->bucket_key[0] = secret;
    secret += 0x9e3779b97f4a7c15ULL;
    secret = (secret ^ (secret >> 30)) * 0xbf58476d1ce4e5b9ULL;
    secret = (secret ^ (secret >> 27)) * 0x94d049bb133111ebULL;
    ix->bucket_key[1] = (secret ^ (secret >> 31)) | 1;
    ix->bucket_shift = 64 - __builtin_ctz(ix->nbuckets);

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


/*
 * At most KVA_CHAIN_MAX probes.  *len tells an insert how full the chain
 * is.  A link out of range ends the chain there, and a chain still going at
 * the cap (a cycle, or a damaged one) is cut there: the entries cut off
 * are freed by eviction or by the next scan that meets them.
 */
static uint32_t
kva_find(kva_index_t *ix, uint64_t key, uint32_t *len)
{
    uint32_t      idx, n, *link;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    link = &kva_buckets(ix)[kva_bucket(ix, key)];

    for (n = 0; *link != KVA_NIL; n++) {
        idx = *link;

        if (idx >= ix->high_water || n == KVA_CHAIN_MAX) {
            *link = KVA_NIL;
            break;
        }

        if (entries[idx].key == key) {
            *len = n + 1;
            return idx;
        }

        link = &entries[idx].next;
    }

    *len = n;

    return KVA_NIL;
}


/*
 * Prefetches the bucket of hashes[i + KVA_PRIME] and the first entry of
 * the chain of hashes[i + KVA_AHEAD], those that are before to.  Only
 * hints: a link out of range is not followed, and nothing is written.
 */
static void
kva_prefetch(kva_index_t *ix, const uint64_t *hashes, uint32_t i,
    uint32_t to)
{
    uint32_t  idx;

    if (i + KVA_PRIME < to) {
        __builtin_prefetch(&kva_buckets(ix)[kva_bucket(ix,
                                                hashes[i + KVA_PRIME])]);
    }

    if (i + KVA_AHEAD < to) {
        idx = kva_buckets(ix)[kva_bucket(ix, hashes[i + KVA_AHEAD])];

        if (idx < ix->high_water) {
            __builtin_prefetch(&kva_entries(ix)[idx]);
        }
    }
}


/*
 * The same for an add: the entry a lookup found for a hash ahead, to be
 * written; the bucket of one the lookup did not reach.
 */
static void
kva_prefetch_add(kva_index_t *ix, const uint64_t *hashes, uint32_t i,
    uint32_t n, const uint32_t *found)
{
    uint32_t  idx, j;

    j = i + KVA_AHEAD;

    if (j < n && found && found[j] < ix->high_water) {
        __builtin_prefetch(&kva_entries(ix)[found[j]], 1);
    }

    j = i + 2 * KVA_AHEAD;

    if (j < n && (found == NULL || found[j] == KVA_NIL)) {
        idx = kva_bucket(ix, hashes[j]);
        __builtin_prefetch(&kva_buckets(ix)[idx], 1);
    }
}


uint32_t
kva_index_match(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    const kva_slotset_t *mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS])
{
    return kva_index_match_found(ix, hashes, n, mask, clk, depth, NULL);
}


uint32_t
kva_index_match_found(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    const kva_slotset_t *mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found)
{
    uint32_t       reached;
    kva_slotset_t  alive;

    alive = *mask;

    reached = kva_index_match_part(ix, hashes, 0, n, &alive, clk, depth,
                                   found, NULL);

    return kva_index_match_done(n, reached, &alive, depth, found);
}


uint32_t
kva_index_match_part(kva_index_t *ix, const uint64_t *hashes, uint32_t from,
    uint32_t to, kva_slotset_t *alive, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found, kva_tier_count_t *tiers)
{
    uint16_t      list[KVA_INLINE];
    unsigned      n, j;
    uint32_t      i, idx, len;
    kva_entry_t  *e, *entries;

    entries = kva_entries(ix);

    /* the set until an inline block: then at most KVA_INLINE, listed */
    n = kva_slotset_empty(alive) ? 0 : KVA_MAX_SLOTS + 1;

    /* the first ones' buckets: the loop prefetches from there on */
    for (i = from; i < to && i < from + KVA_PRIME; i++) {
        __builtin_prefetch(&kva_buckets(ix)[kva_bucket(ix,
                                                             hashes[i])]);
    }

    for (i = from; i < to && n; i++) {
        kva_prefetch(ix, hashes, i, to);

        idx = kva_find(ix, hashes[i], &len);
        e = (idx == KVA_NIL) ? NULL : &entries[idx];

        if (found) {
            found[i] = idx;
        }

        /* a slot that misses block i cannot use any later block */
        if (n > KVA_MAX_SLOTS) {
            n = kva_match_set(ix, e, clk, alive, list, i, depth, tiers);

            if (n == KVA_MAX_SLOTS + 1 && kva_slotset_empty(alive)) {
                n = 0;
            }

        } else {
            n = kva_match_list(ix, e, clk, list, n, i, depth, tiers);
        }
    }

    if (n <= KVA_MAX_SLOTS) {
        kva_slotset_zero(alive);

        for (j = 0; j < n; j++) {
            kva_slotset_add(alive, list[j]);
        }
    }

    return i;
}


uint32_t
kva_index_match_done(uint32_t n, uint32_t reached,
    const kva_slotset_t *alive, uint32_t depth[KVA_MAX_SLOTS],
    uint32_t *found)
{
    unsigned  wi;
    uint32_t  j;
    uint64_t  w;

    for (j = reached; found && j < n; j++) {
        found[j] = KVA_NIL;
    }

    if (kva_slotset_empty(alive)) {
        /* depth of the last slots to drop out is their block number */
        return reached ? reached - 1 : 0;
    }

    for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
        for (w = alive->w[wi]; w; w &= w - 1) {
            depth[wi * 64 + __builtin_ctzll(w)] = n;
        }
    }

    return n;
}


/* returns 0 when the entry was not in its chain (a crash left it so) */
static int
kva_unlink(kva_index_t *ix, uint32_t idx)
{
    uint32_t     *link, n;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    link = &kva_buckets(ix)[kva_bucket(ix, entries[idx].key)];

    for (n = 0; n < KVA_CHAIN_MAX && *link < ix->high_water; n++) {
        if (*link == idx) {
            *link = entries[idx].next;
            return 1;
        }

        link = &entries[*link].next;
    }

    return 0;
}


/*
 * Frees an entry in use, linked or not: one that a crash left out of its
 * chain is freed all the same, so that it cannot be chosen again.
 */
void
kva_index_release(kva_index_t *ix, uint32_t idx)
{
    kva_wide_t   *w;
    kva_entry_t  *e;

    (void) kva_unlink(ix, idx);

    e = &kva_entries(ix)[idx];
    w = kva_wide_of(ix, e);

    /* unlinked from its record first: a record without owner is free */
    e->wide = 0;

    if (w && w->owner == idx) {
        kva_wide_free(ix, (uint32_t) (w - kva_wides(ix)));
    }

    memset(e, 0, sizeof(kva_entry_t));
    e->next = ix->free_head;
    ix->free_head = idx;

    if (ix->used) {
        ix->used--;
    }
}


/* makes room in a full chain: its least recently touched entry goes */
static void
kva_evict_chain(kva_index_t *ix, uint32_t bucket, uint32_t now)
{
    uint32_t      idx, n, age, oldest_age, victim;
    kva_entry_t  *entries;

    entries = kva_entries(ix);
    victim = KVA_NIL;
    oldest_age = 0;
    idx = kva_buckets(ix)[bucket];

    /* kva_find has just cut the chain to the cap and to valid links */
    for (n = 0; n < KVA_CHAIN_MAX && idx < ix->high_water; n++) {
        age = now - entries[idx].stamp;

        /* ties go to the tail: inserted earliest */
        if (age >= oldest_age) {
            oldest_age = age;
            victim = idx;
        }

        idx = entries[idx].next;
    }

    if (victim != KVA_NIL) {
        ix->chain_evictions++;
        kva_index_release(ix, victim);
    }
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

    kva_index_release(ix, victim);

    return kva_alloc(ix);
}


static uint32_t
kva_alloc(kva_index_t *ix)
{
    uint32_t      idx;
    kva_entry_t  *e;

    /*
     * Free entries hold nothing: one that holds bits means a damaged free
     * list (a cycle through entries since reused).  It is dropped, and its
     * entries come back by eviction.
     */
    if (ix->free_head < ix->high_water) {
        idx = ix->free_head;
        e = &kva_entries(ix)[idx];

        if (kva_entry_empty(e)) {
            ix->free_head = e->next;
            ix->used++;
            return idx;
        }
    }

    ix->free_head = KVA_NIL;

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
    kva_index_add_at(ix, hashes, n, KVA_NO_HEAD, slot, srcs, clk, found);
}


void
kva_index_add_at(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    uint32_t pos, unsigned slot, unsigned srcs, const kva_clock_t *clk,
    const uint32_t *found)
{
    int           set, budgets;
    uint32_t      i, idx, len, b, *bucket, anew, at;
    kva_entry_t  *e, *entries;

    anew = 0;

    /* the sources, and an event copy's tier (kva_tier_srcs()) */
    srcs &= KVA_BITS_ALL | kva_tier_srcs(3);

    if ((srcs & KVA_BITS_ALL) == 0 || slot >= KVA_MAX_SLOTS) {
        return;     /* an entry holding nothing would never be freed */
    }

    entries = kva_entries(ix);
    budgets = !kva_slotset_empty(&ix->learn_active);

    for (i = 0; i < n; i++) {
        kva_prefetch_add(ix, hashes, i, n, found);

        idx = found ? found[i] : KVA_NIL;

        /* an eviction by this very loop may have reused the entry */
        if (idx >= ix->high_water || entries[idx].key != hashes[i]
            || kva_entry_empty(&entries[idx]))
        {
            idx = kva_find(ix, hashes[i], &len);

            if (idx == KVA_NIL && len >= KVA_CHAIN_MAX) {
                b = kva_bucket(ix, hashes[i]);
                kva_evict_chain(ix, b, clk->now);
            }
        }

        if (idx == KVA_NIL) {
            idx = kva_alloc(ix);
            e = &entries[idx];
            memset(e, 0, sizeof(kva_entry_t));
            e->key = hashes[i];

            bucket = &kva_buckets(ix)[kva_bucket(ix, hashes[i])];
            e->next = *bucket;
            *bucket = idx;
            ix->inserts++;

        }

        e = &entries[idx];
        at = pos == KVA_NO_HEAD ? KVA_NO_HEAD : pos + i;
        set = kva_entry_touch(ix, e, slot, srcs, clk, budgets, at);

        if (set > 1) {
            /* a seventh holder may evict another entry for a wide record */
            kva_entry_age(ix, e, clk, at);
            set = kva_entry_set(ix, idx, slot, srcs);
        }

        if (set < 0) {
            if (kva_entry_empty(e)) {
                kva_index_release(ix, idx);
            }

            continue;
        }

        /*
         * a block sent again that slot still holds counts again, moved to
         * the generation filling as the server's LRU moves it to the
         * front (its stamp read before the touch below renews it)
         */
        if (set == 0 && (srcs & KVA_BIT_LEARNED)) {
            set = (int) kva_index_learn_again(ix, slot, e->stamp);
        }

        anew += (uint32_t) set;
        e->stamp = clk->now;
    }

    kva_index_learn_note(ix, slot, anew, clk->now);
}


void
kva_index_del(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs)
{
    uint32_t       i, idx, len;
    kva_slotset_t  set;

    /* no slot is there: and a shift past the word would be undefined */
    if (slot >= KVA_MAX_SLOTS) {
        return;
    }

    kva_slotset_zero(&set);
    kva_slotset_add(&set, slot);

    for (i = 0; i < n; i++) {
        idx = kva_find(ix, hashes[i], &len);

        if (idx != KVA_NIL
            && kva_entry_clear(ix, &kva_entries(ix)[idx], &set, srcs))
        {
            kva_index_release(ix, idx);
        }
    }
}


void
kva_index_drop_slots(kva_index_t *ix, const kva_slotset_t *set,
    unsigned srcs)
{
    uint32_t  from;

    for (from = 0; from < ix->high_water; ) {
        from = kva_index_drop_range(ix, set, srcs, from, KVA_NIL);
    }
}


uint32_t
kva_index_drop_range(kva_index_t *ix, const kva_slotset_t *set,
    unsigned srcs, uint32_t from, uint32_t to)
{
    uint32_t      idx, freed;
    kva_entry_t  *e;

    if (to > ix->high_water) {
        to = ix->high_water;
    }

    freed = 0;

    for (idx = from; idx < to; idx++) {
        e = &kva_entries(ix)[idx];

        if (kva_entry_empty(e)) {
            continue;   /* on the free list */
        }

        if (kva_entry_clear(ix, e, set, srcs)) {
            kva_index_release(ix, idx);

            /* a release walks a chain, cold: 65,536 of them took 20 ms */
            if (++freed == KVA_SCAN_RELEASES && idx + 1 < to) {
                return idx + 1;
            }
        }
    }

    return to > from ? to : ix->high_water;
}
