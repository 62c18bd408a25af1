/*
 * kv_aware core: the budget of blocks each slot may learn (kva_index.h).
 *
 * What this router learned of a server is bounded by the server's KV
 * cache: the blocks are counted in generations (kva_index.h says how),
 * and past the budget the oldest stop counting (kva_index_learn_bits()).
 * Apart from the lookups and inserts of kva_index.c, which only call in.
 */

#include "kva_index.h"


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

    for (g = 0; g < KVA_LEARN_GENS; g++) {
        l->start[g] = now;
        l->count[g] = 0;
    }

    kva_slotset_del(&ix->learn_active, slot);
}


/*
 * n blocks newly learned by slot.  When the generation filling is full,
 * the next begins and the cutoff moves: the generations kept, the one
 * filling included, hold at most budget - one generation, so that what
 * is trusted never exceeds the budget while the next one fills.
 */
void
kva_index_learn_note(kva_index_t *ix, unsigned slot, uint32_t n, uint32_t now)
{
    uint32_t      gen, limit, sum, k, p, keep;
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
    l->count[l->cur] = l->count[l->cur] + n < l->count[l->cur]
                       ? UINT32_MAX : l->count[l->cur] + n;

    if (l->count[l->cur] < gen) {
        return;
    }

    l->cur = (l->cur + 1) % KVA_LEARN_GENS;
    l->start[l->cur] = now;
    l->count[l->cur] = 0;

    limit = l->budget > gen ? l->budget - gen : 0;
    sum = 0;
    keep = l->cur;

    for (k = 1; k < KVA_LEARN_GENS; k++) {
        p = (l->cur + KVA_LEARN_GENS - k) % KVA_LEARN_GENS;

        if (l->count[p] > limit - sum) {
            /*
             * Blocks of generation p and before are forgotten; and those
             * of the tick it ended in, which may be either side of it.
             * But never the generation just filled: one long prompt that
             * the server holds whole is not forgotten as it is learned.
             * Nor the tick now: a generation that began and filled within
             * it (two long prompts 16 ms apart) would be forgotten whole
             * as it is learned; its few blocks of the generation before
             * are trusted instead.
             */
            if (k == 1) {
                keep = p;
            }

            l->cutoff = l->start[keep] == now ? now : l->start[keep] + 1;
            l->active = 1;
            kva_slotset_add(&ix->learn_active, slot);
            return;
        }

        sum += l->count[p];
        keep = p;
    }

    /* all the generations fit: what came before them is counted nowhere */
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
