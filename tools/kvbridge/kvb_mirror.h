/*
 * kvbridge: one engine's KV cache as the bridge knows it (one per
 * data-parallel rank: each rank has its own cache), and the translation
 * of the engine's events into the module's.
 *
 * The engine names a block by its own hash, which nobody outside the
 * engine can recompute (sha256 over pickled tokens, seeded per process).
 * The mirror keeps, for every block the engine holds, its hash -> our key
 * (kva_token.h, computed from the event's token ids, chained from the
 * parent's key), so that a child's parent and a removal, which carry only
 * engine hashes, can be translated.
 *
 * What counts as held:
 *
 *   - only dense-attention groups: kv_cache_spec_kind full_attention,
 *     mla_attention (DeepSeek V2/V3, Kimi K2) or sink_full_attention.  A
 *     hybrid model's sliding-window, chunked or mamba groups hold the same
 *     blocks under the same hashes but do not keep a prefix reusable;
 *     their stores are skipped and their removals must not remove a dense
 *     block.  A group's kind comes from the stored events'
 *     kv_cache_spec_kind; until one says otherwise (or with engines that
 *     never say) a group is taken as dense.
 *
 *   - every tier.  A block offloaded to CPU memory or storage costs a
 *     copy, not a prefill, to reuse: it still counts, at its tier.  A
 *     holder is one (group, medium) pair, each told apart by its whole
 *     name, and a holder may hold several copies of one block (vLLM does
 *     not merge a block computed twice, and sends a removal per copy):
 *     the module hears "removed" only when the last copy of the last
 *     holder goes.  A medium is a tier (kva_event.h): GPU (or none),
 *     CPU (and CPU_...), any other name slower (disk, remote storage).
 *     A block is at its fastest holder's tier, a key at its fastest
 *     block's, and the module hears a "stored" at the key's tier
 *     whenever that changes: a GPU copy gone while a CPU one stays moves
 *     the key to CPU, a GPU store brings it back.
 *     An offload tier's events without tokens (vLLM without
 *     self_describing_kv_events) name a block by the engine's hash alone:
 *     they add a holder to a block the mirror holds, and are counted and
 *     skipped otherwise.
 *
 *   - one key, many blocks.  Two engine blocks may map to one key (the
 *     engine hashed something the events do not carry): the key is
 *     counted, and "removed" goes out when no block has it any more.
 *
 *   - LoRA and extra keys.  An adapter's blocks are seeded by the
 *     adapter's name (vLLM also lists the name first among a block's extra
 *     keys: it is taken out there); what remains of the extra keys (images,
 *     cache_salt) goes into the key, so that such blocks never match a
 *     prompt without them.  An adapter named only by lora_id (vLLM before
 *     lora_name) cannot be matched by nginx, which knows adapters by the
 *     name requests carry: its blocks are held under a seed of the id (so
 *     their children and removals are understood) and never published.
 *
 * Snapshots are paced: the keys are kept in an array whose order moves
 * only in ways that keep every key on its side of the snapshot's
 * position, so a key held throughout a snapshot is in it once.
 */

#ifndef _KVB_MIRROR_H_INCLUDED_
#define _KVB_MIRROR_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_event.h"
#include "kvb_vllm.h"


typedef struct kvb_mirror_s  kvb_mirror_t;


typedef struct {
    uint64_t                stored;     /* keys the module heard of */
    uint64_t                removed;
    uint64_t                skipped_group;  /* not dense: the 3 below */
    uint64_t                orphans;    /* parent unknown: no key */
    uint64_t                full;       /* past max_blocks */
    uint64_t                clears;

    /* blocks skipped, by their group's kind */
    uint64_t                skipped_sliding;  /* sliding, chunked local */
    uint64_t                skipped_mamba;
    uint64_t                skipped_kind;     /* cross, encoder, unknown */

    uint64_t                untokened;  /* a tier's hash alone, unknown */
    uint64_t                holders_full;   /* past 64 holders, 32 groups */
    uint64_t                lora_unnamed;   /* held, not published */
    uint64_t                copies;     /* a block a holder already held */
    uint64_t                shared_keys;    /* a key another block has */
    uint64_t                retiered;   /* keys sent again at a new tier */
} kvb_mirror_stats_t;


/*
 * model: the name the engine serves its base model under, as requests
 * carry it in "model".  max_blocks bounds the memory: a block's entry is
 * 24 bytes in a table at most half full, its key 24 bytes in an array and
 * 4 in an index at most half full, a second holder 8 bytes.
 */
kvb_mirror_t *kvb_mirror_create(const char *model, size_t max_blocks);
void kvb_mirror_destroy(kvb_mirror_t *m);

/*
 * Applies a decoded engine batch and appends what changed, in the
 * module's terms, to out (stored, removed, cleared events; out's server,
 * seq and load are the caller's).  Returns -1 only when out of memory.
 */
int kvb_mirror_apply(kvb_mirror_t *m, const kvb_batch_t *in,
    kva_batch_t *out);

/* forgets everything: the engine restarted or its stream cannot be trusted */
void kvb_mirror_clear(kvb_mirror_t *m);

size_t kvb_mirror_size(const kvb_mirror_t *m);

/*
 * The keys held, for a snapshot: up to max keys into out; returns how
 * many, fewer than max at the end.  *cursor is 0 to start a snapshot, and
 * what the call left there to go on: one snapshot at a time, a new one
 * ends the last.  Every key held from the first call to the last is
 * returned once; a key stored after the first call is not (the caller
 * sends the first part before any later change, and the change tells
 * nginx).
 */
size_t kvb_mirror_keys(kvb_mirror_t *m, size_t *cursor, uint64_t *out,
    size_t max);

/* the same, with each key's tier (KVA_EVENT_TIER_*) into tiers */
size_t kvb_mirror_keys_tiered(kvb_mirror_t *m, size_t *cursor, uint64_t *out,
    uint8_t *tiers, size_t max);

/* distinct keys published, what a snapshot holds */
size_t kvb_mirror_nkeys(const kvb_mirror_t *m);

const kvb_mirror_stats_t *kvb_mirror_stats(const kvb_mirror_t *m);


#endif /* _KVB_MIRROR_H_INCLUDED_ */
