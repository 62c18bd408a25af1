/*
 * kv_aware core: block hash -> servers, inside a caller-supplied region.
 *
 * The region may be nginx shared memory or plain malloc'ed memory in a
 * test: the index holds offsets, never pointers, so it stays valid wherever
 * the region is mapped.  The caller serialises access.
 *
 * An entry is one block hash and the slots that hold it (its holders),
 * each with three source bits: what the server told us through events,
 * what this router learned by sending the prefix there, and speculative
 * guesses that stand in for events not yet received.  Learned and
 * speculative bits age out by TTL; event bits are authoritative until
 * removed.  Up to KVA_INLINE holders live in the entry; a block with more
 * (a system prompt every server holds) moves them to a wide record of
 * three bitmaps over all slots, from a pool: memory follows how many
 * servers hold a block, not how many exist (docs/scale.md).
 */

#ifndef _KVA_INDEX_H_INCLUDED_
#define _KVA_INDEX_H_INCLUDED_


#include "kva_index_layout.h"


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
    uint32_t n, const kva_slotset_t *mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS]);

/*
 * Marks slot as holding every hash, for the sources in srcs (KVA_BIT_*),
 * evicting least recently used entries when full.  With KVA_BIT_EVENT,
 * srcs may carry the tier of the copy (kva_tier_srcs(); none: GPU), which
 * replaces the one the slot's event copy had.
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
    uint32_t n, const kva_slotset_t *mask, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found);
void kva_index_add_found(kva_index_t *ix, const uint64_t *hashes,
    uint32_t n, unsigned slot, unsigned srcs, const kva_clock_t *clk,
    const uint32_t *found);

/*
 * add_found for blocks whose place in their prompt is known: hashes[0] is
 * block pos of it (KVA_NO_HEAD: not known, as for add_found).  A chained
 * hash has one place in every prompt, so the bits of other slots past
 * their cutoff that a lookup there would still count (their head room,
 * kva_index_learn_ok_at()) survive the touch; with KVA_NO_HEAD they go.
 */
void kva_index_add_at(kva_index_t *ix, const uint64_t *hashes, uint32_t n,
    uint32_t pos, unsigned slot, unsigned srcs, const kva_clock_t *clk,
    const uint32_t *found);

/*
 * match_found in pieces, for a caller that releases its lock in between:
 * *alive starts as the mask and carries the slots still matching from
 * piece to piece; blocks [from, to) are looked up while any is alive.
 * With tiers (else NULL), tiers[slot] counts, for each slot of the mask
 * (zeroed by the caller), its matched blocks in each tier past GPU: an
 * event copy in host memory or on disk still continues the match.
 * Returns the block the piece stopped at.  kva_index_match_done() then
 * completes depth[] and found[] and returns the deepest match.
 */
uint32_t kva_index_match_part(kva_index_t *ix, const uint64_t *hashes,
    uint32_t from, uint32_t to, kva_slotset_t *alive, const kva_clock_t *clk,
    uint32_t depth[KVA_MAX_SLOTS], uint32_t *found, kva_tier_count_t *tiers);
uint32_t kva_index_match_done(uint32_t n, uint32_t reached,
    const kva_slotset_t *alive, uint32_t depth[KVA_MAX_SLOTS],
    uint32_t *found);

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

/*
 * A block that slot holds, touched again (the entry's stamp before the
 * touch): 1 when it counts anew, moved from the generation it was counted
 * in to the one filling, as the server's LRU moves it to the front.
 */
uint32_t kva_index_learn_again(kva_index_t *ix, unsigned slot,
    uint32_t stamp);

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
