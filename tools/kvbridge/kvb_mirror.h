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
 *   - only full-attention groups.  A hybrid model's sliding-window or
 *     mamba groups hold the same blocks under the same hashes but do not
 *     keep a prefix reusable; their stores are skipped and their removals
 *     must not remove a full-attention block.  A group's kind comes from
 *     the stored events' kv_cache_spec_kind; until one says otherwise (or
 *     with engines that never say) a group is taken as full attention.
 *
 *   - every tier.  A block offloaded to CPU memory or disk costs a copy,
 *     not a prefill, to reuse: it still counts.  A block is held while any
 *     (group, tier) holds it, and the module hears "removed" only when the
 *     last one lets it go.
 *
 *   - LoRA and extra keys.  An adapter's blocks are seeded by the
 *     adapter's name (vLLM also lists the name first among a block's extra
 *     keys: it is taken out there); what remains of the extra keys (images,
 *     cache_salt) goes into the key, so that such blocks never match a
 *     prompt without them.
 */

#ifndef _KVB_MIRROR_H_INCLUDED_
#define _KVB_MIRROR_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kva_event.h"
#include "kvb_vllm.h"


typedef struct kvb_mirror_s  kvb_mirror_t;


typedef struct {
    uint64_t                stored;     /* blocks the module heard of */
    uint64_t                removed;
    uint64_t                skipped_group;  /* not full attention */
    uint64_t                orphans;    /* parent unknown: no key */
    uint64_t                full;       /* past max_blocks */
    uint64_t                clears;
} kvb_mirror_stats_t;


/*
 * model: the name the engine serves its base model under, as requests
 * carry it in "model".  max_blocks bounds the memory (32 bytes a block at
 * most, the table stays at most half full).
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
 * The keys held, for a snapshot: up to max keys from *cursor on into out;
 * returns how many, 0 at the end.  *cursor starts at 0.
 */
size_t kvb_mirror_keys(const kvb_mirror_t *m, size_t *cursor,
    uint64_t *out, size_t max);

const kvb_mirror_stats_t *kvb_mirror_stats(const kvb_mirror_t *m);


#endif /* _KVB_MIRROR_H_INCLUDED_ */
