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
             */
            l->cutoff = l->start[keep] + 1;
            l->active = 1;
            kva_slotset_add(&ix->learn_active, slot);
            return;
        }

        sum += l->count[p];
        keep = p;
    }

    /* all the generations fit: what came before them is counted nowhere */
}
