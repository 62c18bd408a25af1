/*
 * kv_aware core: the budget of blocks each slot may learn (kva_index.h).
 *
 * What this router learned of a server is bounded by the server's KV
 * cache: the blocks are counted in generations (kva_index.h says how),
 * and past the budget the oldest stop counting (kva_index_learn_bits()).
 * Apart from the lookups and inserts of kva_index.c, which only call in.
 */

#include "kva_index.h"


static void kva_learn_cutoff(kva_index_t *ix, unsigned slot, uint32_t gen,
    uint32_t now);


void
kva_index_learn_budget(kva_index_t *ix, unsigned slot, uint32_t blocks,
    uint32_t now)
{
    uint32_t      g;
    kva_learn_t  *l;

    if (slot >= KVA_MAX_SLOTS || ix->learn[slot].budget == blocks) {
        return;
    }

    l = &ix->learn[slot];
    l->budget = blocks;
    l->cur = 0;
    l->active = 0;
    l->keep = 0;
    l->head_room = 0;

    for (g = 0; g < KVA_LEARN_GENS; g++) {
        l->start[g] = now;
        l->count[g] = 0;
    }

    kva_slotset_del(&ix->learn_active, slot);
}


/*
 * n blocks newly learned by slot.  When the generation filling is full,
 * the next begins with the next tick, and the cutoff moves: the
 * generations kept, the one filling included, hold at most budget - one
 * generation, so that what is trusted never exceeds the budget while the
 * next one fills.  Blocks learned later in the tick that filled it (the
 * next pieces of a long prompt, KVA_ADD_CHUNK) are counted in it still:
 * a block's stamp tells its generation, as kva_index_learn_again() and
 * kva_index_learn_head() need.  (Before, a generation began at the tick
 * that filled the last, so blocks stamped then were counted on either
 * side, and a block sent again took its count off the generation after
 * its own: another session's.)
 */
void
kva_index_learn_note(kva_index_t *ix, unsigned slot, uint32_t n, uint32_t now)
{
    uint32_t      gen, g;
    kva_learn_t  *l;

    if (slot >= KVA_MAX_SLOTS) {
        return;
    }

    l = &ix->learn[slot];

    if (l->budget == 0 || n == 0) {
        return;
    }

    l->learned += n;
    gen = l->budget / KVA_LEARN_SHARE ? l->budget / KVA_LEARN_SHARE : 1;

    /* signed difference: right across the wrap of the ticks */
    g = (int32_t) (now - l->start[l->cur]) < 0
        ? (l->cur + KVA_LEARN_GENS - 1) % KVA_LEARN_GENS : l->cur;

    l->count[g] = l->count[g] + n < l->count[g] ? UINT32_MAX
                                                : l->count[g] + n;

    /* the new blocks push the oldest heads out of the server's LRU */
    l->head_room = l->head_room > n ? l->head_room - n : 0;

    if (g == l->cur) {
        if (l->count[g] < gen) {
            return;
        }

        l->cur = (l->cur + 1) % KVA_LEARN_GENS;
        l->start[l->cur] = now + 1;
        l->count[l->cur] = 0;
    }

    kva_learn_cutoff(ix, slot, gen, now);
}


/*
 * The cutoff: the start of the oldest generation that, with those after
 * it, fits in the budget less one generation.
 */
static void
kva_learn_cutoff(kva_index_t *ix, unsigned slot, uint32_t gen, uint32_t now)
{
    uint32_t      limit, sum, k, p, keep;
    kva_learn_t  *l;

    l = &ix->learn[slot];
    limit = l->budget > gen ? l->budget - gen : 0;
    sum = 0;
    keep = l->cur;

    for (k = 1; k < KVA_LEARN_GENS; k++) {
        p = (l->cur + KVA_LEARN_GENS - k) % KVA_LEARN_GENS;

        if (l->count[p] > limit - sum) {
            /*
             * Blocks of generation p and before are forgotten.  But never
             * the generation just filled: one long prompt that the server
             * holds whole is not forgotten as it is learned.
             */
            if (k == 1) {
                keep = p;
                sum = l->count[p];
            }

            /* a generation begun this tick holds nothing yet: not after */
            l->cutoff = (int32_t) (l->start[keep] - now) > 0
                        ? now : l->start[keep];
            l->active = 1;
            kva_slotset_add(&ix->learn_active, slot);

            /* the server holds the rest of its budget from before it */
            l->keep = keep;
            l->head_room = l->budget > sum ? l->budget - sum : 0;
            return;
        }

        sum += l->count[p];
        keep = p;
    }

    /* all the generations fit: what came before them is counted nowhere */
}


/*
 * The blocks counted after stamp and before the cutoff (newer) are those
 * of the generations between and the part of stamp's own generation after
 * it, supposing blocks came evenly in time within a generation; in the
 * server's LRU they went out after stamp's request, which, tail first,
 * kept head_room - newer of its leading blocks.  O(KVA_LEARN_GENS), and
 * only for learned bits the cutoff has passed.
 */
uint32_t
kva_index_learn_head(const kva_learn_t *l, uint32_t stamp)
{
    uint32_t  k, p, q, kept_gens, span;
    uint64_t  newer;

    kept_gens = (l->cur + KVA_LEARN_GENS - l->keep) % KVA_LEARN_GENS;
    newer = 0;

    /* back from keep, not into the generations kept or the one filling */
    for (k = 1; k + kept_gens < KVA_LEARN_GENS; k++) {
        p = (l->keep + KVA_LEARN_GENS - k) % KVA_LEARN_GENS;
        q = (p + 1) % KVA_LEARN_GENS;

        /* signed differences: right across the wrap of the ticks */
        if ((int32_t) (stamp - l->start[p]) >= 0) {
            /* its ticks are start[p] .. start[q] - 1 */
            span = l->start[q] - l->start[p];

            if ((int32_t) span > 0 && (int32_t) (l->start[q] - 1 - stamp) > 0)
            {
                newer += (uint64_t) l->count[p] * (l->start[q] - 1 - stamp)
                         / span;
            }

            return newer < l->head_room ? l->head_room - (uint32_t) newer
                                        : 0;
        }

        newer += l->count[p];

        if (newer >= l->head_room) {
            return 0;
        }
    }

    return 0;
}


/*
 * A block slot already held, touched again by a request sent there: in
 * the server's LRU it is now among the most recent, so it is counted in
 * the generation filling and no more in the one it was counted in (the
 * one its stamp falls in), as if learned anew.  Without this a server's
 * sessions, each sent again and again and each counted once when first
 * learned, were all trusted long after the server had evicted most of
 * them: its budget counted only what their turns added.  A block touched
 * since the generation filling began is taken as counted there already:
 * right for this slot's own touches; one that other slots keep young (a
 * system prompt that all share) is counted once only, as one stamp an
 * entry cannot tell whose touch it was.  Returns 1 when the block counts
 * anew.
 */
uint32_t
kva_index_learn_again(kva_index_t *ix, unsigned slot, uint32_t stamp)
{
    uint32_t      k, p;
    kva_learn_t  *l;

    l = &ix->learn[slot];

    /* signed differences: right across the wrap of the ticks */
    if (l->budget == 0 || (int32_t) (stamp - l->start[l->cur]) >= 0) {
        return 0;
    }

    for (k = 1; k < KVA_LEARN_GENS; k++) {
        p = (l->cur + KVA_LEARN_GENS - k) % KVA_LEARN_GENS;

        if ((int32_t) (stamp - l->start[p]) >= 0) {
            if (l->count[p]) {
                l->count[p]--;
            }

            break;
        }
    }

    return 1;
}
