/*
 * kv_aware core: block hash -> servers, inside a caller-supplied region.
 *
 * The region may be nginx shared memory or plain malloc'ed memory in a
 * test: the index holds offsets, never pointers, so it stays valid wherever
 * the region is mapped.  The caller serialises access.
 *
 * An entry is one block hash with three bitmaps over server slots:
 * what the server told us through events, what this router learned by
 * sending the prefix there, and speculative guesses that stand in for events
 * not yet received.  Learned and speculative bits age out by TTL; event bits
 * are authoritative until removed.
 */

#ifndef _KVA_INDEX_H_INCLUDED_
#define _KVA_INDEX_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_list.h"
#include "kva_slotset.h"


#define KVA_NIL             0xffffffffu

/* an entry's bitmaps are one word a source (kva_slotset.h sets the slots) */
#if (KVA_MAX_SLOTS > 64)
#error "KVA_MAX_SLOTS is over the 64 bits of an entry's bitmaps"
#endif

/*
 * Whole-index scans (clears, snapshots, status counts) go in chunks of this
 * many entries so that a caller can release its lock in between: about
 * 0.25 ms of work a chunk, whatever the index size.
 */
#define KVA_SCAN_CHUNK      65536

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


typedef struct {
    uint64_t            key;
    uint64_t            bits[3];        /* indexed by kva_src_e */
    uint32_t            stamp;          /* last touch, caller's ticks */
    uint32_t            next;           /* hash chain or free list */
} kva_entry_t;


/* in magic: the layout is this one (kva_index_valid(), kva_index_check()) */
#define KVA_INDEX_MAGIC     0x6b766133u     /* "kva3": learned budgets */


/*
 * The budget of what this router learned of one server: no more blocks
 * than the server's KV cache holds, its oldest learned blocks forgotten
 * first.  The blocks a slot learns anew are counted in generations of
 * budget / KVA_LEARN_SHARE; when one fills, the slot's cutoff moves to
 * the start of the oldest generation that, with those after it, fits in
 * the budget less one generation.  A learned bit of that slot on an entry
 * last touched before the cutoff counts no more, and is cleared when the
 * entry is next touched.  O(1) an add, O(KVA_LEARN_GENS) a generation: no
 * scan under the lock.  The TTL still applies.
 */
#define KVA_LEARN_GENS      16
#define KVA_LEARN_SHARE     8

typedef struct {
    uint32_t            budget;         /* blocks, 0: none */
    uint32_t            cutoff;         /* ticks; with active */
    uint32_t            cur;            /* the generation filling */
    uint32_t            active;         /* the budget was reached */
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
    kva_slotset_t       learn_active;   /* slots whose cutoff is in force */
    kva_learn_t         learn[KVA_MAX_SLOTS];
    /* uint32_t buckets[nbuckets]; kva_entry_t entries[capacity]; */
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
} kva_slot_count_t;


size_t kva_index_region_size(uint32_t capacity);
uint32_t kva_index_capacity_for(size_t region_size);

/*
 * Returns NULL when the region cannot hold a single bucket and entry.
 * The secret keys the bucket choice: a random value per index, so that
 * nobody outside can pick keys that pile into one bucket.
 */
kva_index_t *kva_index_init(void *region, size_t region_size,
    uint64_t secret);
int kva_index_valid(const kva_index_t *ix, size_t region_size);

/*
 * For each slot in mask, depth[slot] = number of leading hashes that slot
 * holds.  Stops at the first hash no slot in mask holds, so a miss costs
 * one probe.  Returns the deepest match.
 */
uint32_t kva_index_match(kva_index_t *ix, const uint64_t *hashes,
    uint32_t n, uint64_t mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS]);

/*
 * Marks slot as holding every hash, for the sources in srcs (KVA_BIT_*),
 * evicting least recently used entries when full.
 */
void kva_index_add(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs, const kva_clock_t *clk);

/*
 * The same two, for a lookup followed by an add under one lock, as the
 * balancer does: match records in found[0 .. n) where each hash's entry
 * was (KVA_NIL past the scan), and add starts from there instead of
 * probing again.  found[] is only a hint: add checks every key.
 */
uint32_t kva_index_match_found(kva_index_t *ix, const uint64_t *hashes,
    uint32_t n, uint64_t mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found);
void kva_index_add_found(kva_index_t *ix, const uint64_t *hashes,
    uint32_t n, unsigned slot, unsigned srcs, const kva_clock_t *clk,
    const uint32_t *found);

/*
 * match_found in pieces, for a caller that releases its lock in between:
 * *alive starts as the mask and carries the slots still matching from
 * piece to piece; blocks [from, to) are looked up while any is alive.
 * Returns the block the piece stopped at.  kva_index_match_done() then
 * completes depth[] and found[] and returns the deepest match.
 */
uint32_t kva_index_match_part(kva_index_t *ix, const uint64_t *hashes,
    uint32_t from, uint32_t to, uint64_t *alive, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found);
uint32_t kva_index_match_done(uint32_t n, uint32_t reached, uint64_t alive,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found);

/*
 * Sets slot's budget of learned blocks (0: none, only the TTL).  A new
 * budget starts counting afresh; what was learned before stays until the
 * new count reaches it.  Cheap when unchanged: call it before each add.
 */
void kva_index_learn_budget(kva_index_t *ix, unsigned slot, uint32_t blocks,
    uint32_t now);

/* n blocks newly learned by slot: kva_index_add_found() counts them */
void kva_index_learn_note(kva_index_t *ix, unsigned slot, uint32_t n,
    uint32_t now);

/* the learned bits of an entry that its slots' budgets still allow */
static inline uint64_t
kva_index_learn_bits(const kva_index_t *ix, uint64_t bits, uint32_t stamp)
{
    int       slot;
    uint64_t  m;

    for (m = bits & ix->learn_active.w[0]; m; m &= m - 1) {
        slot = __builtin_ctzll(m);

        /* signed difference: right across the wrap of the ticks */
        if ((int32_t) (stamp - ix->learn[slot].cutoff) < 0) {
            bits &= ~(1ULL << slot);
        }
    }

    return bits;
}

/* forgets what the sources in srcs say about slot for these hashes */
void kva_index_del(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    unsigned slot, unsigned srcs);

/* forgets what srcs say about the slots in set (whole-index scan) */
void kva_index_drop_slots(kva_index_t *ix, const kva_slotset_t *set,
    unsigned srcs);

/*
 * The same over the entries [from, to) only; to is clamped to the entries
 * in use.  Returns where the next chunk starts, ix->high_water when done;
 * that is before to once KVA_SCAN_RELEASES entries have been freed.
 */
uint32_t kva_index_drop_range(kva_index_t *ix, const kva_slotset_t *set,
    unsigned srcs, uint32_t from, uint32_t to);

/*
 * The index's invariants: chains without cycles, no longer than
 * KVA_CHAIN_MAX, each entry in the bucket its key maps to; every entry in
 * use linked exactly once; the free list without cycles and without linked
 * entries; the counters agreeing.  Returns 0, or -1 with a reason in err.
 * Reads the whole index: O(capacity + nbuckets), no memory of its own.
 */
int kva_index_check(const kva_index_t *ix, char *err, size_t err_len);

/* the bucket a key maps to, for tests and benchmarks */
uint32_t kva_index_bucket(const kva_index_t *ix, uint64_t key);

/* per-slot entry counts for status pages (whole-index scan) */
void kva_index_count(kva_index_t *ix, const kva_clock_t *clk,
    kva_slot_count_t counts[KVA_MAX_SLOTS]);

/* adds the counts of entries [from, to) to counts; returns as drop_range */
uint32_t kva_index_count_range(kva_index_t *ix, const kva_clock_t *clk,
    uint32_t from, uint32_t to, kva_slot_count_t counts[KVA_MAX_SLOTS]);


#endif /* _KVA_INDEX_H_INCLUDED_ */
