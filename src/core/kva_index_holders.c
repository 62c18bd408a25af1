/*
 * kv_aware core: an entry's holders, written (kva_index.h says what they
 * are).  Up to KVA_INLINE in the entry; the next one moves them all to a
 * wide record, and a removal that leaves KVA_INLINE or fewer moves them
 * back, so that a block briefly held everywhere does not keep a record.
 *
 * The pool of wide records is bounded; when it is full, the least recently
 * touched of a few sampled wide blocks is evicted, whole, as a full index
 * evicts an entry.  A worker dying here (the lock then freed) may leave a
 * record handed out but not linked, or an entry with both inline holders
 * and a record: the record wins while linked, and one whose owner does not
 * link it back is taken again when the sampler meets it.
 */

#include <string.h>

#include "kva_index.h"
#include "kva_index_int.h"


#define KVA_WIDE_SAMPLES    8


static uint32_t kva_wide_alloc(kva_index_t *ix);
static int kva_entry_widen(kva_index_t *ix, uint32_t idx);
static void kva_entry_narrow(kva_index_t *ix, kva_entry_t *e, kva_wide_t *w);


void
kva_wide_free(kva_index_t *ix, uint32_t r)
{
    kva_wide_t  *w;

    w = &kva_wides(ix)[r];
    memset(w->bits, 0, sizeof(w->bits));
    w->owner = KVA_NIL;
    w->next = ix->wide_free;
    ix->wide_free = r;

    if (ix->wide_used) {
        ix->wide_used--;
    }
}


static uint32_t
kva_wide_alloc(kva_index_t *ix)
{
    uint32_t      i, r, owner, victim, oldest;
    kva_wide_t   *wides;
    kva_entry_t  *entries;

    wides = kva_wides(ix);
    entries = kva_entries(ix);

    /* a free record has no owner: one that has means a damaged list */
    if (ix->wide_free < ix->wide_hw) {
        r = ix->wide_free;

        if (wides[r].owner == KVA_NIL) {
            ix->wide_free = wides[r].next;
            ix->wide_used++;
            return r;
        }
    }

    ix->wide_free = KVA_NIL;

    if (ix->wide_hw < ix->nwide) {
        ix->wide_used++;
        return ix->wide_hw++;
    }

    victim = KVA_NIL;
    oldest = 0;

    for (i = 0; i < KVA_WIDE_SAMPLES; i++) {
        r = (ix->wide_hand + i) % ix->nwide;
        owner = wides[r].owner;

        /* handed out, never linked (a crash): it is free, and counted */
        if (owner >= ix->high_water || entries[owner].wide != r + 1) {
            ix->wide_hand = (r + 1) % ix->nwide;
            return r;
        }

        /* the entry touched first goes: signed, right across the wrap */
        if (victim == KVA_NIL
            || (int32_t) (entries[owner].stamp - oldest) < 0)
        {
            victim = r;
            oldest = entries[owner].stamp;
        }
    }

    ix->wide_hand = (ix->wide_hand + KVA_WIDE_SAMPLES) % ix->nwide;
    ix->wide_evictions++;

    kva_index_release(ix, wides[victim].owner);

    /* the release put it on the free list */
    r = ix->wide_free;
    ix->wide_free = wides[r].next;
    ix->wide_used++;

    return r;
}


/* the holders of entry idx move to a wide record; -1: no record */
static int
kva_entry_widen(kva_index_t *ix, uint32_t idx)
{
    unsigned      i, slot, src;
    uint32_t      r;
    kva_wide_t   *w;
    kva_entry_t  *e;

    r = kva_wide_alloc(ix);

    if (r == KVA_NIL) {
        return -1;
    }

    e = &kva_entries(ix)[idx];
    w = &kva_wides(ix)[r];
    memset(w->bits, 0, sizeof(w->bits));
    w->owner = idx;
    w->next = KVA_NIL;

    for (i = 0; i < KVA_INLINE; i++) {
        slot = kva_holder_slot(e->h[i]);

        for (src = 0; src < KVA_SRC_COUNT && slot < KVA_MAX_SLOTS; src++) {
            if (kva_holder_srcs(e->h[i]) & (1u << src)) {
                w->bits[src][slot / 64] |= 1ULL << (slot % 64);
            }
        }
    }

    /* linked first: from here on the record is what the entry holds */
    e->wide = r + 1;
    memset(e->h, 0, sizeof(e->h));

    return 0;
}


/* a wide record holding KVA_INLINE slots or fewer goes back inline */
static void
kva_entry_narrow(kva_index_t *ix, kva_entry_t *e, kva_wide_t *w)
{
    unsigned      wi, n, slot, src, srcs;
    uint64_t      any;
    kva_holder_t  h[KVA_INLINE];

    n = 0;

    for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
        any = w->bits[0][wi] | w->bits[1][wi] | w->bits[2][wi];
        n += (unsigned) __builtin_popcountll(any);
    }

    if (n > KVA_INLINE) {
        return;
    }

    memset(h, 0, sizeof(h));
    n = 0;

    for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
        any = w->bits[0][wi] | w->bits[1][wi] | w->bits[2][wi];

        for ( ; any; any &= any - 1) {
            slot = wi * 64 + (unsigned) __builtin_ctzll(any);
            srcs = 0;

            for (src = 0; src < KVA_SRC_COUNT; src++) {
                srcs |= (unsigned) (w->bits[src][wi] >> (slot % 64) & 1)
                        << src;
            }

            h[n++] = kva_holder(slot, srcs);
        }
    }

    /* the holders first: while wide is set, they are not read */
    memcpy(e->h, h, sizeof(h));
    n = e->wide - 1;
    e->wide = 0;
    kva_wide_free(ix, n);
}


/*
 * Adds srcs to what slot holds of entry idx (an event copy's tier with
 * them: kva_holder_add(); a wide record keeps none).  Returns 1 when slot's
 * learned bit is new (the budget counts it), 0 when not, -1 when the slot
 * could not be added (the wide pool has no record at all).
 */
int
kva_entry_set(kva_index_t *ix, uint32_t idx, unsigned slot, unsigned srcs)
{
    int           anew;
    unsigned      i, empty;
    kva_wide_t   *w;
    kva_entry_t  *e;

    e = &kva_entries(ix)[idx];
    w = kva_wide_of(ix, e);

    if (w == NULL && e->wide) {
        e->wide = 0;    /* a link out of range: a damaged entry */
    }

    if (w == NULL) {
        empty = KVA_INLINE;

        for (i = 0; i < KVA_INLINE; i++) {
            if (e->h[i] && kva_holder_slot(e->h[i]) == slot) {
                anew = (srcs & KVA_BIT_LEARNED)
                       && !(kva_holder_srcs(e->h[i]) & KVA_BIT_LEARNED);
                e->h[i] = kva_holder_add(e->h[i], slot, srcs);
                return anew;
            }

            if (e->h[i] == 0 && empty == KVA_INLINE) {
                empty = i;
            }
        }

        if (empty < KVA_INLINE) {
            e->h[empty] = kva_holder_add(0, slot, srcs);
            return (srcs & KVA_BIT_LEARNED) != 0;
        }

        if (kva_entry_widen(ix, idx) != 0) {
            return -1;
        }

        e = &kva_entries(ix)[idx];
        w = kva_wide_of(ix, e);
    }

    anew = (srcs & KVA_BIT_LEARNED)
           && !(w->bits[KVA_SRC_LEARNED][slot / 64] >> (slot % 64) & 1);

    for (i = 0; i < KVA_SRC_COUNT; i++) {
        if (srcs & (1u << i)) {
            w->bits[i][slot / 64] |= 1ULL << (slot % 64);
        }
    }

    return anew;
}


/*
 * The stamp is shared by all holders of the entry: before a touch revives
 * them, drop the learned and speculative bits that aged out, and learned
 * bits past their slot's budget, and past its head room for block pos of
 * a prompt (the entry's place in every prompt, its hash being chained;
 * KVA_NO_HEAD: not known, and the head room does not count).  A bit
 * within the head room stays and, renewed, counts whole until the cutoff
 * passes it again, as any bit that another slot keeps young: dropping it
 * cut the chain of every prompt through the block.  In a quick agents
 * run with a shared system prompt, three blocks after it that other
 * sessions also sent lost a server's bit that way, and nginx forgot a
 * session of 1,212 blocks the server held whole.  Past the head room the
 * bit goes: kept, it would be renewed whole where the server holds none.
 */
void
kva_entry_age(kva_index_t *ix, kva_entry_t *e, const kva_clock_t *clk,
    uint32_t pos)
{
    int          learned, spec;
    unsigned     i, wi, srcs;
    uint32_t     age;
    kva_wide_t  *w;

    age = clk->now - e->stamp;
    learned = age < clk->ttl_learned;
    spec = age < clk->ttl_spec;
    w = kva_wide_of(ix, e);

    if (w) {
        for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
            w->bits[KVA_SRC_LEARNED][wi] = learned
                ? kva_index_learn_bits(ix, wi, w->bits[KVA_SRC_LEARNED][wi],
                                       e->stamp, pos)
                : 0;

            if (!spec) {
                w->bits[KVA_SRC_SPEC][wi] = 0;
            }
        }

        /* holders aged out: six or fewer go back inline, as on a clear */
        kva_entry_narrow(ix, e, w);

        return;
    }

    for (i = 0; i < KVA_INLINE; i++) {
        srcs = kva_holder_srcs(e->h[i]);

        if ((srcs & KVA_BIT_LEARNED)
            && (!learned
                || !kva_index_learn_ok_at(ix, kva_holder_slot(e->h[i]),
                                          e->stamp, pos)))
        {
            srcs &= ~KVA_BIT_LEARNED;
        }

        if (!spec) {
            srcs &= ~KVA_BIT_SPEC;
        }

        e->h[i] = kva_holder_with(e->h[i], srcs);
    }
}


/* forgets what srcs say of the slots in set; 1: the entry holds nothing */
int
kva_entry_clear(kva_index_t *ix, kva_entry_t *e, const kva_slotset_t *set,
    unsigned srcs)
{
    unsigned     i, wi, src, left;
    kva_wide_t  *w;

    w = kva_wide_of(ix, e);

    if (w == NULL && e->wide) {
        e->wide = 0;
    }

    if (w) {
        for (src = 0; src < KVA_SRC_COUNT; src++) {
            if (srcs & (1u << src)) {
                for (wi = 0; wi < KVA_SLOT_WORDS; wi++) {
                    w->bits[src][wi] &= ~set->w[wi];
                }
            }
        }

        kva_entry_narrow(ix, e, w);

    } else {
        for (i = 0; i < KVA_INLINE; i++) {
            if (e->h[i] && kva_slotset_has(set, kva_holder_slot(e->h[i]))) {
                left = kva_holder_srcs(e->h[i]) & ~srcs;
                e->h[i] = kva_holder_with(e->h[i], left);
            }
        }
    }

    return kva_entry_empty(e);
}
