/*
 * Unit tests of the block index (src/core/kva_index.c).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kva_index.h"
#include "kva_rand.h"


/* a set of the slots in the low 64 of a mask */
static const kva_slotset_t *
mask_set(uint64_t mask)
{
    static kva_slotset_t  set;

    memset(&set, 0, sizeof(set));
    set.w[0] = mask;

    return &set;
}


static uint64_t
mix(uint64_t x)
{
    /* random-looking keys, like the XXH3 hashes in production */
    return kva_rand_next(&x);
}


static void
chain(uint64_t *h, uint32_t n, uint64_t seed)
{
    uint32_t  i;

    for (i = 0; i < n; i++) {
        h[i] = mix(seed * 1000003 + i);
    }
}


static uint32_t *
buckets_of(kva_index_t *ix)
{
    return (uint32_t *) (ix + 1);
}


static kva_entry_t *
entries_of(kva_index_t *ix)
{
    return (kva_entry_t *) (buckets_of(ix) + ix->nbuckets);
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


/* n keys that the index puts into bucket b: what only the secret allows */
static void
keys_in_bucket(kva_index_t *ix, uint32_t b, uint64_t *k, uint32_t n,
    uint64_t seed)
{
    uint32_t  i;
    uint64_t  x;

    for (i = 0, x = seed << 40; i < n; x++) {
        if (kva_index_bucket(ix, mix(x)) == b) {
            k[i++] = mix(x);
        }
    }
}


static kva_index_t *
fresh(uint32_t cap, uint64_t secret)
{
    size_t  size;

    size = kva_index_region_size(cap);

    return kva_index_init(calloc(1, size), size, secret);
}


/* keys in progression, such as ids: as spread as random ones */
static void
test_progressions(void)
{
    uint32_t      s, i, j, worst, bad, n;
    uint64_t      k[4096], secret;
    kva_clock_t   clk = { 1000, 100, 10, {{ ~0ULL }} };
    kva_index_t  *ix;

    /*
     * Keys in arithmetic progression, as a publisher of ids might send
     * them: 1, 2, 3 ..., and (message << 32) + i.  Multiply-shift alone
     * piled them into a fraction of the buckets for about 1 secret in
     * 30, and the chain cap evicted up to 30% of them.  Under 20
     * secrets (three of which, mix(1015), mix(1016) and mix(1030), made
     * multiply-shift alone lose 132,327, 33,403 and 69,898), 9/10 of
     * the index's capacity (8 keys a bucket, as t/45 fills it) of
     * either kind must stay but for a few.
     */
    worst = 0;
    bad = 0;
    n = 471040;

    for (s = 12; s < 32; s++) {
        secret = mix(1000 + s);

        for (j = 0; j < 2; j++) {
            ix = fresh(524287, secret);

            for (i = 0; i < n; i++) {
                k[i % 4096] = j ? ((uint64_t) (i / 8192 + 1) << 32)
                                  + i % 8192 + 1
                                : (uint64_t) i + 1;

                if (i % 4096 == 4095) {
                    kva_index_add(ix, k, 4096, 0, KVA_BIT_EVENT, &clk);
                }
            }

            if (ix->chain_evictions > worst) {
                worst = (uint32_t) ix->chain_evictions;
            }

            bad += ix->chain_evictions > n / 1000;
            free(ix);
        }
    }

    ok(bad == 0, "keys in progression, 20 secrets: at most 0.1%% past the "
       "chain cap (%u indexes lost more; at most %u of %u)", bad, worst, n);
}


/* keys an attacker could make collide, and keys that do collide */
static void
test_flood(void)
{
    char          err[128];
    uint32_t      i, depth[KVA_MAX_SLOTS], b, len, longest, idx, same;
    uint64_t      k[4096];
    kva_clock_t   clk = { 1000, 100, 10, {{ ~0ULL }} };
    kva_index_t  *ix, *ix2;
    kva_entry_t  *entries;

    ix = fresh(8192, 12345);
    ix2 = fresh(8192, 67890);

    /* keys with their low 20 bits equal: one bucket for the old index */
    for (i = 0; i < 4096; i++) {
        k[i] = (mix(i) << 20) | 0xabcde;
    }

    kva_index_add(ix, k, 4096, 0, KVA_BIT_EVENT, &clk);
    ok(sound(ix, "low-bit flood"), "sound after a low-bit flood");

    longest = 0;
    entries = entries_of(ix);

    for (b = 0; b < ix->nbuckets; b++) {
        for (len = 0, idx = buckets_of(ix)[b]; idx != KVA_NIL;
             idx = entries[idx].next)
        {
            len++;
        }

        longest = len > longest ? len : longest;
    }

    ok(longest <= 12 && ix->chain_evictions == 0,
       "keys equal in their low bits spread: longest chain %u", longest);

    kva_index_match(ix, k, 4096, mask_set(1), &clk, depth);
    ok(depth[0] == 4096, "all of them found");

    for (i = 0, same = 0; i < 4096; i++) {
        same += kva_index_bucket(ix, k[i]) == kva_index_bucket(ix2, k[i]);
    }

    ok(same < 64, "another secret, other buckets (%u of 4096 the same)",
       same);

    /* keys that do share a bucket: the chain stops at the cap */
    keys_in_bucket(ix2, 7, k, 100, 1);
    kva_index_add(ix2, k, 100, 1, KVA_BIT_EVENT, &clk);

    for (len = 0, idx = buckets_of(ix2)[7]; idx != KVA_NIL;
         idx = entries_of(ix2)[idx].next)
    {
        len++;
    }

    ok(len == KVA_CHAIN_MAX && ix2->chain_evictions == 100 - KVA_CHAIN_MAX,
       "a chain holds %u of 100 colliding keys, %llu evicted from it", len,
       (unsigned long long) ix2->chain_evictions);
    ok(sound(ix2, "capped chain"), "sound with a capped chain");

    kva_index_match(ix2, k + 100 - KVA_CHAIN_MAX, KVA_CHAIN_MAX,
                    mask_set(1 << 1), &clk, depth);
    ok(depth[1] == KVA_CHAIN_MAX, "the newest of the chain are kept");
    kva_index_match(ix2, k, 1, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 0, "the oldest went");

    /* a touched entry survives newer inserts into its chain */
    clk.now++;
    kva_index_add(ix2, k + 100 - KVA_CHAIN_MAX, 1, 1, KVA_BIT_EVENT, &clk);
    keys_in_bucket(ix2, 7, k, 110, 1);
    clk.now++;
    kva_index_add(ix2, k + 100, 10, 1, KVA_BIT_EVENT, &clk);
    kva_index_match(ix2, k + 100 - KVA_CHAIN_MAX, 1, mask_set(1 << 1), &clk,
                    depth);
    ok(depth[1] == 1, "the chain evicts its least recently used");

    /* the check can fail: a key moved to another bucket */
    entries_of(ix2)[buckets_of(ix2)[7]].key ^= 1;
    ok(kva_index_check(ix2, err, sizeof(err)) == -1,
       "check sees an entry in a foreign bucket: %s", err);

    free(ix);
    free(ix2);
}


/*
 * What a worker killed with the lock held can leave behind, made by hand:
 * every operation must go on without crashing or looping, and the index
 * must heal as the entries concerned are evicted or dropped.
 */
static void
test_crash_states(void)
{
    char          err[128];
    uint32_t      i, depth[KVA_MAX_SLOTS], a, b, bk, n;
    uint64_t      k[4096], cyc[3], fill[1024];
    kva_clock_t   clk = { 1000, 1u << 30, 10, {{ 1 }} };
    kva_index_t  *ix;
    kva_entry_t  *entries, *e;

    /* 1. allocated, never linked, as a kill between alloc and link */
    ix = fresh(1000, 99);
    entries = entries_of(ix);
    chain(k, 1000, 21);
    kva_index_add(ix, k, 999, 0, KVA_BIT_LEARNED, &clk);
    e = &entries[ix->high_water++];
    ix->used++;
    memset(e, 0, sizeof(*e));
    e->key = mix(777);
    e->next = buckets_of(ix)[kva_index_bucket(ix, e->key)];  /* half-built */

    ok(kva_index_check(ix, err, sizeof(err)) == -1,
       "check sees the unlinked entry: %s", err);

    /* the index is full: adds evict, and the sampler meets the lost one */
    for (i = 0; i < 3; i++) {
        clk.now += 10;
        chain(k, 1000, 22 + i);
        kva_index_add(ix, k, 1000, 1, KVA_BIT_LEARNED, &clk);
    }

    ok(sound(ix, "unlinked"), "evictions went on and reclaimed it");
    kva_index_match(ix, k, 1000, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 1000, "the index works after it");

    /* 2. unlinked, bits set (kill inside release): a clear frees it */
    {
        a = buckets_of(ix)[kva_index_bucket(ix, k[5])];
        n = 0;

        while (entries[a].key != k[5]) {
            a = entries[a].next;
        }

        /* unlink k[5] by hand, leave its entry as it was */
        bk = kva_index_bucket(ix, k[5]);

        if (buckets_of(ix)[bk] == a) {
            buckets_of(ix)[bk] = entries[a].next;

        } else {
            for (b = buckets_of(ix)[bk]; entries[b].next != a;
                 b = entries[b].next)
            {
                n++;
            }

            entries[b].next = entries[a].next;
        }
    }

    ok(kva_index_check(ix, err, sizeof(err)) == -1,
       "check sees an entry in use, not linked: %s", err);
    kva_index_match(ix, k, 1000, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 5, "its block is missed");
    kva_index_del(ix, k + 5, 1, 1, KVA_BIT_LEARNED);
    kva_index_drop_slots(ix, mask_set(1 << 1), KVA_BITS_ALL);
    ok(sound(ix, "unlinked in use") && ix->used == 0,
       "a clear frees it with the rest");
    free(ix);

    /* 3. a cycle in a chain (the old unlocked reset could make one) */
    ix = fresh(1000, 5);
    entries = entries_of(ix);
    keys_in_bucket(ix, 3, cyc, 3, 2);
    kva_index_add(ix, cyc, 2, 0, KVA_BIT_EVENT, &clk);
    a = buckets_of(ix)[3];
    b = entries[a].next;
    entries[b].next = a;

    ok(kva_index_check(ix, err, sizeof(err)) == -1,
       "check sees the cycle: %s", err);

    kva_index_match(ix, cyc + 2, 1, mask_set(1), &clk, depth);
    ok(depth[0] == 0, "a lookup through the cycle ends");
    ok(sound(ix, "cycle"), "and cuts it");

    entries[b].next = a;
    kva_index_add(ix, cyc + 2, 1, 0, KVA_BIT_EVENT, &clk);
    kva_index_del(ix, cyc, 1, 0, KVA_BIT_EVENT);
    kva_index_match(ix, cyc + 1, 2, mask_set(1), &clk, depth);
    ok(depth[0] == 2 && sound(ix, "cycle, add"),
       "add and del through a cycle");

    /* 4. links out of range: a bucket head and an entry's next */
    buckets_of(ix)[9] = 0xfffffff0u;
    entries[buckets_of(ix)[3]].next = 123456;
    kva_index_match(ix, cyc + 1, 1, mask_set(1), &clk, depth);
    keys_in_bucket(ix, 9, k, 1, 3);
    kva_index_add(ix, k, 1, 0, KVA_BIT_EVENT, &clk);
    kva_index_match(ix, k, 1, mask_set(1), &clk, depth);
    ok(depth[0] == 1, "an entry added where a bad head was");
    kva_index_drop_slots(ix, mask_set(~0ULL), KVA_BITS_ALL);
    ok(sound(ix, "bad links") && ix->used == 0, "bad links cut, sound");

    /* 5. a free list that loops back onto itself */
    chain(fill, 1000, 31);
    kva_index_add(ix, fill, 100, 0, KVA_BIT_EVENT, &clk);
    kva_index_del(ix, fill, 2, 0, KVA_BIT_EVENT);
    entries[entries[ix->free_head].next].next = ix->free_head;

    ok(kva_index_check(ix, err, sizeof(err)) == -1,
       "check sees the free-list cycle: %s", err);

    for (i = 0; i < 5; i++) {
        clk.now += 10;
        chain(fill, 1000, 40 + i);
        kva_index_add(ix, fill, 1000, 0, KVA_BIT_EVENT, &clk);
    }

    kva_index_match(ix, fill, 1000, mask_set(1), &clk, depth);
    ok(depth[0] == 1000, "adds go on past a looping free list");
    kva_index_drop_slots(ix, mask_set(~0ULL), KVA_BITS_ALL);
    ok(ix->used == 0 && sound(ix, "free-list cycle"), "and it heals");

    /* 6. counters off: check says so */
    ix->used = 3;
    ok(kva_index_check(ix, err, sizeof(err)) == -1, "check: %s", err);
    ix->used = 0;
    ix->high_water = ix->capacity + 1;
    ok(kva_index_check(ix, err, sizeof(err)) == -1, "check: %s", err);

    free(ix);
}


/* learned slot: blocks of its nonzero depth, else 0 */
static uint32_t
learned_depth(kva_index_t *ix, const uint64_t *h, uint32_t n, unsigned slot,
    kva_clock_t *clk)
{
    uint32_t  depth[KVA_MAX_SLOTS];

    memset(depth, 0, sizeof(depth));
    kva_index_match(ix, h, n, mask_set(1ULL << slot), clk, depth);

    return depth[slot];
}


static uint64_t
learned_count(kva_index_t *ix, unsigned slot, kva_clock_t *clk)
{
    kva_slot_count_t  counts[KVA_MAX_SLOTS];

    kva_index_count(ix, clk, counts);

    return counts[slot].entries[KVA_SRC_LEARNED];
}


/* a server's learned blocks bounded by its budget, the oldest going first */
static void
test_learn_budget(uint32_t t0)
{
    uint32_t      p, d, oldest_kept;
    uint64_t      h[30][100], n0, n1;
    kva_clock_t   clk = { 0, 1u << 30, 10, {{ 0 }} };
    kva_index_t  *ix;

    ix = fresh(65536, 99);

    for (p = 0; p < 30; p++) {
        chain(h[p], 100, 7000 + p);
    }

    /* slot 0: 800 blocks, slot 1 none: each learns 30 prompts of 100 */
    clk.now = t0;
    kva_index_learn_budget(ix, 0, 800, clk.now);

    for (p = 0; p < 30; p++) {
        clk.now = t0 + 1 + p;
        kva_index_learn_budget(ix, 0, 800, clk.now);
        kva_index_add(ix, h[p], 100, 0, KVA_BIT_LEARNED, &clk);
        kva_index_add(ix, h[p], 100, 1, KVA_BIT_LEARNED, &clk);
    }

    n0 = learned_count(ix, 0, &clk);
    n1 = learned_count(ix, 1, &clk);
    ok(n0 <= 800 && n0 >= 600, "t0 %u: slot 0 keeps %llu learned blocks, "
       "within its budget of 800", t0, (unsigned long long) n0);
    ok(n1 == 3000, "slot 1, without a budget, keeps all %llu",
       (unsigned long long) n1);

    /* the newest prompts whole, the oldest gone, nothing in between torn */
    oldest_kept = 30;

    for (p = 0; p < 30; p++) {
        d = learned_depth(ix, h[p], 100, 0, &clk);

        if (d == 100 && oldest_kept == 30) {
            oldest_kept = p;
        }

        if ((d != 0 && d != 100) || (d == 0 && oldest_kept != 30)) {
            break;
        }
    }

    ok(p == 30 && oldest_kept >= 22 && oldest_kept <= 24,
       "prompts 0..%u forgotten, %u..29 kept", oldest_kept - 1, oldest_kept);
    ok(learned_depth(ix, h[0], 100, 1, &clk) == 100,
       "slot 1 still has the oldest");

    /* the other slot touching an old block does not revive slot 0's bit */
    clk.now++;
    kva_index_add(ix, h[0], 100, 1, KVA_BIT_LEARNED, &clk);
    ok(learned_depth(ix, h[0], 100, 0, &clk) == 0,
       "a block slot 1 touches stays forgotten for slot 0");

    /*
     * A prompt used again is recent again: it outlives those learned after
     * it that were not, as in the server's own LRU.
     */
    clk.now++;
    kva_index_add(ix, h[oldest_kept], 100, 0, KVA_BIT_LEARNED, &clk);

    for (p = 0; p < 5; p++) {
        chain(h[p], 100, 9000 + p);
        clk.now++;
        kva_index_add(ix, h[p], 100, 0, KVA_BIT_LEARNED, &clk);
    }

    ok(learned_depth(ix, h[oldest_kept], 100, 0, &clk) == 100
       && learned_depth(ix, h[oldest_kept + 1], 100, 0, &clk) == 0,
       "prompt %u, used again, outlives prompt %u", oldest_kept,
       oldest_kept + 1);
    ok(learned_depth(ix, h[4], 100, 0, &clk) == 100, "the newest is kept");

    /* matching what is held counts nothing new: the cutoff stays */
    d = ix->learn[0].cutoff;

    for (p = 0; p < 50; p++) {
        clk.now++;
        kva_index_add(ix, h[4], 100, 0, KVA_BIT_LEARNED, &clk);
    }

    ok(ix->learn[0].cutoff == d && learned_depth(ix, h[3], 100, 0, &clk)
       == 100, "prompts used again and again push nothing out");

    /* a budget of 0: only the TTL again */
    kva_index_learn_budget(ix, 0, 0, clk.now);
    ok(learned_count(ix, 0, &clk) > 800 && (ix->learn_active.w[0] & 1) == 0,
       "budget 0: what the TTL allows (%llu)",
       (unsigned long long) learned_count(ix, 0, &clk));
    ok(sound(ix, "learned budget"), "the index is sound");

    free(ix);
}


/*
 * Sessions sent again and again to one server, together more than its
 * cache holds: as in its LRU, only the most recently sent are trusted.
 * Each turn sends a session's whole context again and adds a little, so
 * a budget that counted only what turns added trusted them all.
 */
static void
test_learn_again(uint32_t t0)
{
    uint32_t      s, turn, len, kept, gone, head, all;
    uint64_t      h[12][120], n0;
    kva_clock_t   clk = { 0, 1u << 30, 10, {{ 0 }} };
    kva_index_t  *ix;

    ix = fresh(65536, 77);

    for (s = 0; s < 12; s++) {
        chain(h[s], 120, 11000 + s);
    }

    /* 12 sessions of 50 blocks fit in 800; 10 more a turn, they do not */
    clk.now = t0;
    kva_index_learn_budget(ix, 0, 800, clk.now);

    for (turn = 0; turn < 7; turn++) {
        for (s = 0; s < 12; s++) {
            clk.now++;
            kva_index_add(ix, h[s], 50 + 10 * turn, 0, KVA_BIT_LEARNED,
                          &clk);
        }
    }

    n0 = learned_count(ix, 0, &clk);
    ok(n0 <= 800, "t0 %u: sessions sent again: %llu blocks trusted, within "
       "the budget of 800", t0, (unsigned long long) n0);

    /*
     * As in the server's LRU, which frees a request's blocks tail first:
     * the last sent whole, from some session on, the one before its head,
     * none before that; in all no more than the budget.
     */
    kept = 0;
    gone = 0;
    head = 0;
    all = 0;

    for (s = 0; s < 12; s++) {
        len = learned_depth(ix, h[s], 120, 0, &clk);
        all += len;

        if (len == 110) {
            kept++;

        } else if (len == 0 && kept == 0 && head == 0) {
            gone++;

        } else if (len > 0 && len < 110 && kept == 0 && head == 0) {
            head = len;
        }
    }

    ok(kept >= 5 && kept <= 7 && gone + kept + (head > 0) == 12,
       "the %u sessions sent last are trusted whole, the one before them "
       "its first %u blocks, the %u before none", kept, head, gone);
    ok(all <= 800 && all >= 700, "%u blocks trusted in all, the server's "
       "LRU of 800 holds 800", all);
    ok(sound(ix, "learned again"), "the index is sound");

    free(ix);
}


/* learned as the balancer learns it: KVA_ADD_CHUNK blocks a call */
static void
add_pieces(kva_index_t *ix, const uint64_t *h, uint32_t n, unsigned slot,
    kva_clock_t *clk)
{
    uint32_t  from, piece;

    for (from = 0; from < n; from += piece) {
        piece = n - from < KVA_ADD_CHUNK ? n - from : KVA_ADD_CHUNK;
        kva_index_add_at(ix, h + from, piece, from, slot, KVA_BIT_LEARNED,
                         clk, NULL);
    }
}


/*
 * Two sessions on one server of 1,600 blocks, taking turns, together past
 * it (as in the agents workload, where this sent one of them away from
 * its history): the engine frees the tail of the one used less recently,
 * so its head is still there, and a third larger prompt then takes that
 * too and the head of the other.  Learned in pieces, as the balancer
 * does: each fills a generation within one tick.
 */
static void
test_learn_heads(uint32_t t0)
{
    uint32_t      k, a, b, c, d;
    uint64_t      ha[1200], hb[700], hc[1500], hd[100];
    kva_clock_t   clk = { 0, 1u << 30, 10, {{ 0 }} };
    kva_index_t  *ix;

    static const uint32_t  turns[4][2] = {
        { 236, 1106 }, { 316, 1112 }, { 391, 1117 }, { 574, 1144 }
    };

    ix = fresh(65536, 79);
    chain(ha, 1200, 13000);
    chain(hb, 700, 14000);
    chain(hc, 1500, 15000);
    chain(hd, 100, 16000);

    clk.now = t0;
    kva_index_learn_budget(ix, 0, 1600, clk.now);

    for (k = 0; k < 4; k++) {
        clk.now++;
        add_pieces(ix, hb, turns[k][0], 0, &clk);
        clk.now++;
        add_pieces(ix, ha, turns[k][1], 0, &clk);
    }

    a = learned_depth(ix, ha, 1200, 0, &clk);
    b = learned_depth(ix, hb, 700, 0, &clk);
    ok(a == 1144 && b >= 400 && b <= 456, "t0 %u: the session sent last "
       "whole (%u of 1,144 blocks), the other its first %u of 574 (the "
       "LRU: 456), not 0", t0, a, b);
    ok(learned_depth(ix, hb, 700, 1, &clk) == 0, "another server holds none "
       "of it");

    /* 100 blocks more in the server's LRU: 100 fewer of that head */
    clk.now++;
    add_pieces(ix, hd, 100, 0, &clk);
    d = learned_depth(ix, hb, 700, 0, &clk);
    ok(d + 100 == b, "after 100 new blocks the head is %u (the LRU: %u)", d,
       b - 100);

    /* a third, larger: what is left of the two is the head of the later */
    clk.now++;
    add_pieces(ix, hc, 1500, 0, &clk);
    a = learned_depth(ix, ha, 1200, 0, &clk);
    b = learned_depth(ix, hb, 700, 0, &clk);
    c = learned_depth(ix, hc, 1500, 0, &clk);
    ok(c == 1500 && a <= 100 && b == 0, "after a prompt of 1,500: it whole, "
       "%u blocks of the session before, %u of the one before that", a, b);

    /* a head sent again is whole again, and what it adds is counted */
    clk.now++;
    add_pieces(ix, ha, 1144, 0, &clk);
    ok(learned_depth(ix, ha, 1200, 0, &clk) == 1144
       && learned_depth(ix, hc, 1500, 0, &clk) < 1500,
       "the session sent again is whole, the prompt before it loses its "
       "tail");

    /*
     * Its first blocks sent to another server (a prompt both share): the
     * touch keeps this server's bits on them, within its head, and the
     * head stays whole (dropping them cut every prompt through them).
     */
    c = learned_depth(ix, hc, 1500, 0, &clk);
    clk.now++;
    add_pieces(ix, hc, 3, 1, &clk);
    d = learned_depth(ix, hc, 1500, 0, &clk);
    ok(c > 3 && d == c, "a head of %u blocks, its first 3 sent to another "
       "server: %u", c, d);
    ok(sound(ix, "learned heads"), "the index is sound");

    free(ix);
}


/*
 * A prompt P of 1,000 blocks of which server 0 keeps a head (a prompt of
 * 1,500 sent after it), then sent whole to server 1 (its session moved):
 * server 0 keeps its head of P, and only its head, though the touch
 * renews every entry of P; kept while server 1 sends P again, it is not
 * counted in server 0's budget, and the rest of P is not renewed there.
 */
static void
test_learn_head_moved(uint32_t t0)
{
    uint32_t      a0, a1, k;
    uint64_t      hp[1000], hq[1500], hr[800];
    kva_clock_t   clk = { 0, 1u << 30, 10, {{ 0 }} };
    kva_index_t  *ix;

    ix = fresh(65536, 81);
    chain(hp, 1000, 21000);
    chain(hq, 1500, 22000);

    clk.now = t0;
    kva_index_learn_budget(ix, 0, 1600, clk.now);
    clk.now++;
    add_pieces(ix, hp, 1000, 0, &clk);
    clk.now++;
    add_pieces(ix, hq, 1500, 0, &clk);
    a0 = learned_depth(ix, hp, 1000, 0, &clk);

    clk.now++;
    add_pieces(ix, hp, 1000, 1, &clk);
    a1 = learned_depth(ix, hp, 1000, 0, &clk);
    ok(a0 > 0 && a0 < 1000 && a1 == a0, "t0 %u: server 0's head of P, %u "
       "blocks, after server 1 was sent P: %u", t0, a0, a1);

    /* server 0 is sent 4,800 new blocks; server 1 P again, each time */
    for (k = 0; k < 6; k++) {
        clk.now++;
        chain(hr, 800, 24000 + k);
        add_pieces(ix, hr, 800, 0, &clk);
        clk.now++;
        add_pieces(ix, hp, 1000, 1, &clk);
    }

    ok(learned_depth(ix, hp, 1000, 0, &clk) <= a0
       && learned_count(ix, 0, &clk) <= 1600 + a0, "  then, 4,800 blocks "
       "later, it holds no more of P than that head (%u), its learned "
       "entries %llu", learned_depth(ix, hp, 1000, 0, &clk),
       (unsigned long long) learned_count(ix, 0, &clk));
    ok(sound(ix, "head moved"), "  the index is sound");

    free(ix);
}


/*
 * Two long prompts to one server within one tick (16 ms), each filling a
 * generation: the second is trusted whole as it is learned, not cut off
 * with the tick its generation began in.
 */
static void
test_learn_same_tick(uint32_t t0)
{
    uint32_t      s;
    uint64_t      h[10][400];
    kva_clock_t   clk = { 0, 1u << 30, 10, {{ 0 }} };
    kva_index_t  *ix;

    ix = fresh(65536, 78);

    for (s = 0; s < 10; s++) {
        chain(h[s], 400, 12000 + s);
    }

    clk.now = t0;
    kva_index_learn_budget(ix, 0, 800, clk.now);

    /* eight generations of 100 and more, a tick each: the budget in force */
    for (s = 0; s < 8; s++) {
        clk.now++;
        kva_index_add(ix, h[s], 100, 0, KVA_BIT_LEARNED, &clk);
    }

    clk.now++;
    kva_index_add(ix, h[8], 400, 0, KVA_BIT_LEARNED, &clk);
    kva_index_add(ix, h[9], 400, 0, KVA_BIT_LEARNED, &clk);

    ok(learned_depth(ix, h[9], 400, 0, &clk) == 400,
       "t0 %u: the prompt learned last in a tick of two is trusted whole",
       t0);
    ok(learned_count(ix, 0, &clk) <= 800, "within the budget of 800");

    free(ix);
}

int
main(void)
{
    void              *region, *tiny;
    size_t             size;
    uint32_t           depth[KVA_MAX_SLOTS], deepest, i, cap;
    uint64_t           a[64], b[64], c[40000];
    kva_clock_t        clk = { 1000, 100, 10, {{ 1 << 2 }} };
    kva_index_t       *ix;
    kva_slot_count_t   counts[KVA_MAX_SLOTS];

    ok(sizeof(kva_entry_t) == 32, "an entry is 32 bytes, 2 a cache line");

    size = kva_index_region_size(10000);
    ok(kva_index_capacity_for(size) == 10000, "capacity_for inverts size");
    ok((size - sizeof(kva_index_t)) / 10000 <= 48,
       "at most 48 bytes per entry, buckets included (%zu)",
       (size - sizeof(kva_index_t)) / 10000);
    tiny = malloc(16);
    ok(kva_index_init(tiny, 16, 1) == NULL, "a tiny region is refused");
    free(tiny);

    region = malloc(size);
    ix = kva_index_init(region, size, 0x9e3779b97f4a7c15ULL);
    ok(ix != NULL && kva_index_valid(ix, size), "index initialised");

    chain(a, 64, 1);
    chain(b, 64, 2);
    memcpy(b, a, 20 * sizeof(uint64_t));     /* b shares 20 blocks with a */

    memset(depth, 0xff, sizeof(depth));
    deepest = kva_index_match(ix, a, 64, mask_set(0x7), &clk, depth);
    ok(deepest == 0 && depth[0] == 0 && depth[1] == 0 && depth[2] == 0,
       "empty index matches nothing");

    kva_index_add(ix, a, 64, 1, KVA_BIT_LEARNED, &clk);
    kva_index_add(ix, b, 30, 2, KVA_BIT_EVENT, &clk);

    deepest = kva_index_match(ix, a, 64, mask_set(0x7), &clk, depth);
    ok(deepest == 64 && depth[1] == 64, "slot 1 holds all of a");
    ok(depth[2] == 20, "slot 2 holds the 20 shared blocks (%u)", depth[2]);
    ok(depth[0] == 0, "slot 0 holds nothing");

    deepest = kva_index_match(ix, b, 64, mask_set(0x7), &clk, depth);
    ok(deepest == 30 && depth[2] == 30 && depth[1] == 20,
       "b: slot 2 has 30, slot 1 has 20");

    deepest = kva_index_match(ix, a, 64, mask_set(0x1), &clk, depth);
    ok(deepest == 0, "mask excludes slots");

    /* precise slots trust events only, the others learned guesses only */
    clk.precise.w[0] = 0;
    kva_index_match(ix, b, 30, mask_set(1 << 2), &clk, depth);
    ok(depth[2] == 0, "event bits of a degraded server are not trusted");
    clk.precise.w[0] = 1 << 1 | 1 << 2;
    kva_index_match(ix, a, 64, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 0, "learned bits of a precise server are ignored");
    clk.precise.w[0] = 1 << 2;

    /* TTL: learned bits fade, event bits do not */
    clk.now += 150;
    kva_index_match(ix, a, 64, mask_set(0x7), &clk, depth);
    ok(depth[1] == 0 && depth[2] == 20, "learned entries expire by TTL");

    /* touching an entry must not revive another slot's expired bits */
    kva_index_add(ix, a, 1, 3, KVA_BIT_LEARNED, &clk);
    kva_index_match(ix, a, 1, mask_set(0xf), &clk, depth);
    ok(depth[1] == 0 && depth[3] == 1, "a touch does not revive others");

    kva_index_add(ix, a, 5, 4, KVA_BIT_SPEC, &clk);
    kva_index_match(ix, a, 5, mask_set(1 << 4), &clk, depth);
    ok(depth[4] == 5, "speculative entries count while fresh");
    clk.now += 11;
    kva_index_match(ix, a, 5, mask_set(1 << 4), &clk, depth);
    ok(depth[4] == 0, "speculative entries expire sooner");

    /* removal */
    kva_index_del(ix, b + 10, 1, 2, KVA_BIT_EVENT);
    kva_index_match(ix, b, 64, mask_set(1 << 2), &clk, depth);
    ok(depth[2] == 10, "a removed block ends the match (%u)", depth[2]);

    kva_index_drop_slots(ix, mask_set(1 << 2), KVA_BITS_ALL);
    kva_index_match(ix, b, 64, mask_set(1 << 2), &clk, depth);
    ok(depth[2] == 0, "drop_slots clears a slot");

    kva_index_count(ix, &clk, counts);
    ok(counts[2].entries[KVA_SRC_EVENT] == 0 && counts[3].entries[1] == 1,
       "counts per slot and source");

    /* eviction keeps the index bounded and prefers old entries */
    free(region);
    cap = 1000;
    size = kva_index_region_size(cap);
    region = malloc(size);
    ix = kva_index_init(region, size, 0x9e3779b97f4a7c15ULL);
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
    ok(sound(ix, "evicting"), "sound after evictions");
    ok(ix->evictions > 0, "evicted %llu entries",
       (unsigned long long) ix->evictions);

    kva_index_match(ix, c + 100, 100, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 0, "the oldest unused prefix was evicted");

    kva_index_match(ix, c + 3900, 100, mask_set(1 << 1), &clk, depth);
    ok(depth[1] == 100, "the newest prefix is intact");

    /* hints from a lookup survive evictions made by the add they guide */
    {
        uint32_t  found[100];

        kva_index_match_found(ix, c + 3900, 100, mask_set(1 << 1), &clk, depth,
                              found);
        ok(found[0] != KVA_NIL && found[99] != KVA_NIL,
           "match records where it found each block");

        clk.now += 10;
        chain(c, 200, 11);
        /* hints for c[100..] used for c[0..], across evictions */
        kva_index_match_found(ix, c + 100, 100, mask_set(1 << 3), &clk,
                              depth, found);
        kva_index_add_found(ix, c + 100, 100, 3, KVA_BIT_LEARNED, &clk,
                            found);
        kva_index_match_found(ix, c + 100, 100, mask_set(1 << 3), &clk,
                              depth, found);
        kva_index_add_found(ix, c, 100, 3, KVA_BIT_LEARNED, &clk, found);
        kva_index_add_found(ix, c + 100, 100, 3, KVA_BIT_LEARNED, &clk,
                            found);
        kva_index_match(ix, c, 200, mask_set(1 << 3), &clk, depth);
        ok(depth[3] == 200, "stale hints are checked, not trusted (%u)",
           depth[3]);
    }

    /* lookup cost does not depend on size: chains stay short at full load */
    free(region);
    size = kva_index_region_size(40000);
    region = malloc(size);
    ix = kva_index_init(region, size, 0x9e3779b97f4a7c15ULL);
    chain(c, 40000, 9);
    kva_index_add(ix, c, 40000, 0, KVA_BIT_LEARNED, &clk);
    kva_index_match(ix, c, 40000, mask_set(1), &clk, depth);
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

    ok(sound(ix, "full"), "a full index is sound");

    /* a clear frees a bounded number of entries per call */
    {
        void       *copy = malloc(size);
        uint32_t    from, calls;

        memcpy(copy, region, size);
        from = kva_index_drop_range(copy, mask_set(1), KVA_BITS_ALL, 0,
                                    KVA_NIL);
        ok(from == KVA_SCAN_RELEASES, "a chunk stops after %u frees (%u)",
           KVA_SCAN_RELEASES, from);

        for (calls = 1; from < ((kva_index_t *) copy)->high_water; calls++) {
            from = kva_index_drop_range(copy, mask_set(1), KVA_BITS_ALL, from,
                                        KVA_NIL);
        }

        ok(((kva_index_t *) copy)->used == 0 && calls == 10
           && sound(copy, "cleared"), "and the next ones go on (%u calls)",
           calls);
        free(copy);
    }

    /* the index is position independent: a copy elsewhere still works */
    {
        void  *copy = malloc(size);

        memcpy(copy, region, size);
        memset(region, 0, size);
        kva_index_match(copy, c, 100, mask_set(1), &clk, depth);
        ok(depth[0] == 100, "a copied region works at another address");
        free(copy);
    }

    free(region);

    test_flood();
    test_progressions();
    test_crash_states();
    test_learn_budget(1000);
    test_learn_budget(0xffffffe0u);
    test_learn_again(1000);
    test_learn_again(0xffffffe0u);
    test_learn_heads(1000);
    test_learn_heads(0xfffffff8u);
    test_learn_heads(0xfffffffcu);
    test_learn_head_moved(1000);
    test_learn_head_moved(0xfffffff0u);
    test_learn_same_tick(1000);
    test_learn_same_tick(0xfffffff0u);

    return done_testing();
}
