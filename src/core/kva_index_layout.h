/*
 * kv_aware core: the block index's layout (kva_index.h says what it is):
 * its constants, the entry, the wide record, the header, and the learned
 * budgets' inline tests.  Apart so that the index's own files can read it
 * without including kva_index.h back.
 */

#ifndef _KVA_INDEX_LAYOUT_H_INCLUDED_
#define _KVA_INDEX_LAYOUT_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_list.h"
#include "kva_slotset.h"


#define KVA_NIL             0xffffffffu

/* a holder keeps its slot in 11 bits, the 2 above for its tier */
#if (KVA_MAX_SLOTS > 2048)
#error "KVA_MAX_SLOTS is over the 11 bits of a holder's slot"
#endif

#define KVA_INLINE          6

/* wide records: one for this many entries, and at least KVA_WIDE_MIN */
#define KVA_WIDE_SHARE      128
#define KVA_WIDE_MIN        8

/*
 * Whole-index clears go in chunks of this many entries so that a caller
 * can release its lock in between: 0.7 to 2.9 ms a chunk on a full index
 * (bench_worst, an entry freed each), within the event path's 5 ms a
 * hold, whatever the index size.  Status counts: KVA_COUNT_CHUNK.
 */
#define KVA_SCAN_CHUNK      65536

/*
 * The status pages' count of entries per slot and source reads every
 * holder of an entry and tests its freshness (learned budgets, head
 * room): 1.8 to 3.6 ms a chunk of KVA_SCAN_CHUNK on a full index
 * (bench_worst, 32m and 256m), and while a client polled the page the
 * first third of routed requests waited 28 to 36 ms (t/45, 4 runs of
 * 5).  In chunks of this many: 0.2 to 0.3 ms a hold, within a
 * request's budget, and t/45's first third 4 to 6 ms.
 */
#define KVA_COUNT_CHUNK     4096

/*
 * Hashes a caller adds or deletes under one hold of its lock.  In a full
 * index each add evicts an entry, 0.5 to 1 us with the entry cold, so a
 * long prompt (2,048 blocks at 128k tokens) or a large event message goes
 * in pieces that keep others waiting about 0.25 ms at most.
 */
#define KVA_ADD_CHUNK       256
#define KVA_SCAN_RELEASES   4096

/*
 * No chain grows past this many entries: an insert into a full chain
 * evicts the chain's oldest entry, and every walk stops here, so one
 * lookup costs at most this many probes whatever the keys.  Random keys
 * at the index's load (2 to 4 per bucket) reach it about never.
 */
#define KVA_CHAIN_MAX       16


/* what put an entry there: kva_src_names[] in this order */
#define KVA_SRCS(X)                                                           \
    X(KVA_SRC_EVENT, "event")                                                 \
    X(KVA_SRC_LEARNED, "learned")                                             \
    X(KVA_SRC_SPEC, "speculative")

typedef enum {
    KVA_SRCS(KVA_LIST_ENUM)
    KVA_SRC_COUNT
} kva_src_e;

extern const char  *const kva_src_names[];

/* the tiers past GPU, kva_slot_count_t.slow[] in this order */
extern const char  *const kva_tier_slow_names[];


/*
 * Where a server keeps its copy of a block, as its events say: GPU memory,
 * host memory (an offload tier, a copy over PCIe away), or disk and
 * remote storage.  Learned and speculative guesses are GPU: a request
 * routed there computed the block there.
 */
#define KVA_TIER_GPU        0
#define KVA_TIER_CPU        1
#define KVA_TIER_DISK       2
#define KVA_TIERS           3
#define KVA_TIERS_SLOW      (KVA_TIERS - 1)

/* an add's srcs with the tier of its event copy: KVA_BIT_EVENT | this */
#define kva_tier_srcs(tier)     ((unsigned) (tier) << 3)


/*
 * A holder: tier << 14 | slot << 3 | its sources (KVA_BIT_*); 0: an empty
 * place.  The tier is that of the event copy (0 without KVA_BIT_EVENT).
 * Wide records keep no tier: a block held by more than KVA_INLINE servers
 * counts as in GPU memory on all of them (docs/design.md).
 */
typedef uint16_t  kva_holder_t;

#define KVA_HOLDER_TIER_SHIFT   14
#define KVA_HOLDER_UNTIERED     0x3fff          /* all but the tier */

#define kva_holder(slot, srcs)  ((kva_holder_t) ((slot) << 3 | (srcs)))
#define kva_holder_slot(h)      ((unsigned) (h) >> 3 & 0x7ff)
#define kva_holder_srcs(h)      ((unsigned) (h) & 7)
#define kva_holder_tier(h)      ((unsigned) (h) >> KVA_HOLDER_TIER_SHIFT)


typedef struct {
    uint64_t            key;
    uint32_t            stamp;          /* last touch, caller's ticks */
    uint32_t            next;           /* hash chain or free list */
    kva_holder_t        h[KVA_INLINE];  /* ignored while wide */
    uint32_t            wide;           /* 0: none; else its record + 1 */
} kva_entry_t;                          /* 32 bytes: 2 a cache line */


/* the holders of a block with more than KVA_INLINE of them */
typedef struct {
    uint64_t            bits[3][KVA_SLOT_WORDS];    /* by kva_src_e */
    uint32_t            owner;          /* its entry */
    uint32_t            next;           /* free list */
} kva_wide_t;


/* in magic: the layout is this one (kva_index_valid(), kva_index_check()) */
#define KVA_INDEX_MAGIC     0x6b766135u     /* "kva5": budgets' head room */


/*
 * The budget of what this router learned of one server: no more blocks
 * than the server's KV cache holds, its oldest learned blocks forgotten
 * first.  The blocks a slot learns anew, or is sent again after they
 * were counted (kva_index_learn_again()), are counted in generations of
 * budget / KVA_LEARN_SHARE; when one fills, the slot's cutoff moves to
 * the start of the oldest generation that, with those after it, fits in
 * the budget less one generation.  A learned bit of that slot on an entry
 * last touched before the cutoff counts no more, and is cleared when the
 * entry is next touched.  O(1) a block learned anew, O(KVA_LEARN_GENS) at
 * most a block sent again and a generation: no scan under the lock.  The
 * TTL still applies.
 *
 * The head room: the server's LRU holds the budget, so past what the
 * router still trusts (at most the budget less a generation) it holds
 * some blocks from before the cutoff too, the most recently used.  An
 * engine frees a finished request's blocks tail first (vLLM's block
 * pool, kvsim), and of the request last sent before the cutoff it keeps
 * the head, of the one before a shorter head, and so on.  A learned bit
 * last touched before the cutoff still counts for a prompt's first
 * head_room - newer blocks, newer being the blocks counted after its
 * touch and before the cutoff (kva_index_learn_head()).  Without it a
 * session whose server had to make room for a larger one was forgotten
 * whole when the engine had lost only its tail, and left its server.
 */
#define KVA_LEARN_GENS      16
#define KVA_LEARN_SHARE     8

typedef struct {
    uint32_t            budget;         /* blocks, 0: none */
    uint32_t            cutoff;         /* ticks; with active */
    uint32_t            cur;            /* the generation filling */
    uint32_t            active;         /* the budget was reached */
    uint32_t            keep;           /* the generation cutoff began */
    uint32_t            head_room;      /* blocks held from before cutoff */
    uint32_t            start[KVA_LEARN_GENS];  /* ticks */
    uint32_t            count[KVA_LEARN_GENS];  /* blocks learned anew */
    uint64_t            learned;        /* blocks learned anew, in all */
} kva_learn_t;


typedef struct {
    uint32_t            magic;
    uint32_t            capacity;
    uint32_t            nbuckets;       /* power of two */
    uint32_t            used;
    uint32_t            high_water;     /* entries handed out at least once */
    uint32_t            free_head;
    uint32_t            hand;           /* eviction sampling position */
    uint32_t            bucket_shift;   /* 64 - log2(nbuckets) */
    uint64_t            secret;         /* keys the bucket choice */
    uint64_t            bucket_key[2];  /* derived from the secret */
    uint64_t            evictions;      /* LRU evictions, index full */
    uint64_t            chain_evictions;    /* inserts into a full chain */
    uint64_t            inserts;
    uint32_t            nwide;          /* wide records in the region */
    uint32_t            wide_used;
    uint32_t            wide_hw;        /* handed out at least once */
    uint32_t            wide_free;      /* free list head */
    uint32_t            wide_hand;      /* eviction sampling position */
    uint32_t            wide_pad;
    uint64_t            wide_evictions; /* blocks evicted, pool full */
    kva_slotset_t       learn_active;   /* slots whose cutoff is in force */
    kva_learn_t         learn[KVA_MAX_SLOTS];
    /*
     * uint32_t buckets[nbuckets]; kva_entry_t entries[capacity];
     * kva_wide_t wides[nwide];
     */
} kva_index_t;


#define KVA_BIT_EVENT       (1u << KVA_SRC_EVENT)
#define KVA_BIT_LEARNED     (1u << KVA_SRC_LEARNED)
#define KVA_BIT_SPEC        (1u << KVA_SRC_SPEC)
#define KVA_BITS_ALL        (KVA_BIT_EVENT | KVA_BIT_LEARNED | KVA_BIT_SPEC)


/*
 * What lookups trust.  For slots in `precise` (servers whose events are
 * in sync) event bits are the truth and learned guesses are ignored; for
 * the others, learned bits stand in and event bits may be stale.
 * Speculative bits count for everybody while young.
 */
typedef struct {
    uint32_t            now;            /* caller's ticks */
    uint32_t            ttl_learned;
    uint32_t            ttl_spec;
    kva_slotset_t       precise;
} kva_clock_t;


typedef struct {
    uint64_t            entries[3];     /* per source, fresh or not */
    uint64_t            slow[KVA_TIERS_SLOW];   /* event entries per tier
                                                   past GPU, inline ones */
} kva_slot_count_t;


/* per candidate: the matched blocks held in each tier past GPU */
typedef struct {
    uint32_t            n[KVA_TIERS_SLOW];
} kva_tier_count_t;


/* whether slot's budget still allows a learned bit last touched at stamp */
static inline int
kva_index_learn_ok(const kva_index_t *ix, unsigned slot, uint32_t stamp)
{
    /* signed difference: right across the wrap of the ticks */
    return !kva_slotset_has(&ix->learn_active, slot)
           || (int32_t) (stamp - ix->learn[slot].cutoff) >= 0;
}


#define KVA_NO_HEAD  UINT32_MAX

/*
 * kva_index_learn.c: how many leading blocks of a prompt last touched at
 * stamp, before the cutoff, the server still holds (kva_learn_t)
 */
uint32_t kva_index_learn_head(const kva_learn_t *l, uint32_t stamp);

/*
 * The same for block pos of a prompt (KVA_NO_HEAD: none): before the
 * cutoff, within the head room (kva_learn_t says what it is).
 */
static inline int
kva_index_learn_ok_at(const kva_index_t *ix, unsigned slot, uint32_t stamp,
    uint32_t pos)
{
    const kva_learn_t  *l;

    if (kva_index_learn_ok(ix, slot, stamp)) {
        return 1;
    }

    l = &ix->learn[slot];

    return pos < l->head_room && pos < kva_index_learn_head(l, stamp);
}


/*
 * The learned bits of word wi of a wide record that the budgets allow,
 * for block pos of a prompt (KVA_NO_HEAD: past the cutoff only).
 */
static inline uint64_t
kva_index_learn_bits(const kva_index_t *ix, unsigned wi, uint64_t bits,
    uint32_t stamp, uint32_t pos)
{
    unsigned  slot;
    uint64_t  m;

    for (m = bits & ix->learn_active.w[wi]; m; m &= m - 1) {
        slot = wi * 64 + (unsigned) __builtin_ctzll(m);

        if (!kva_index_learn_ok_at(ix, slot, stamp, pos)) {
            bits &= ~(1ULL << (slot % 64));
        }
    }

    return bits;
}


#endif /* _KVA_INDEX_LAYOUT_H_INCLUDED_ */
