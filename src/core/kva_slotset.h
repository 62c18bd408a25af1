/*
 * kv_aware core: a set of server slots, as many words as the slots need.
 *
 * Every set of slots (the precise ones, those whose learned budget is in
 * force, those to drop, those reserved) is one of these, so that the
 * number of slots is one constant and no code says "64 bits" for it.
 * Members are found word by word with ctz: a sparse set of 1,024 slots
 * costs 16 word tests, not 1,024 bit tests.
 */

#ifndef _KVA_SLOTSET_H_INCLUDED_
#define _KVA_SLOTSET_H_INCLUDED_


#include <stdint.h>
#include <string.h>


#define KVA_MAX_SLOTS       1024
#define KVA_SLOT_WORDS      ((KVA_MAX_SLOTS + 63) / 64)


typedef struct {
    uint64_t            w[KVA_SLOT_WORDS];
} kva_slotset_t;


static inline void
kva_slotset_zero(kva_slotset_t *s)
{
    memset(s, 0, sizeof(kva_slotset_t));
}


/* slots at or past KVA_MAX_SLOTS are never members: no shift out of range */
static inline void
kva_slotset_add(kva_slotset_t *s, unsigned slot)
{
    if (slot < KVA_MAX_SLOTS) {
        s->w[slot / 64] |= 1ULL << (slot % 64);
    }
}


static inline void
kva_slotset_del(kva_slotset_t *s, unsigned slot)
{
    if (slot < KVA_MAX_SLOTS) {
        s->w[slot / 64] &= ~(1ULL << (slot % 64));
    }
}


static inline int
kva_slotset_has(const kva_slotset_t *s, unsigned slot)
{
    return slot < KVA_MAX_SLOTS && (s->w[slot / 64] >> (slot % 64) & 1);
}


static inline int
kva_slotset_empty(const kva_slotset_t *s)
{
    unsigned  i;

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        if (s->w[i]) {
            return 0;
        }
    }

    return 1;
}


static inline unsigned
kva_slotset_count(const kva_slotset_t *s)
{
    unsigned  i, n;

    n = 0;

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        n += (unsigned) __builtin_popcountll(s->w[i]);
    }

    return n;
}


/* a |= b */
static inline void
kva_slotset_or(kva_slotset_t *a, const kva_slotset_t *b)
{
    unsigned  i;

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        a->w[i] |= b->w[i];
    }
}


/* a &= ~b */
static inline void
kva_slotset_andnot(kva_slotset_t *a, const kva_slotset_t *b)
{
    unsigned  i;

    for (i = 0; i < KVA_SLOT_WORDS; i++) {
        a->w[i] &= ~b->w[i];
    }
}


/* the first member at or after from, KVA_MAX_SLOTS when none */
static inline unsigned
kva_slotset_next(const kva_slotset_t *s, unsigned from)
{
    unsigned  i;
    uint64_t  w;

    if (from >= KVA_MAX_SLOTS) {
        return KVA_MAX_SLOTS;
    }

    i = from / 64;
    w = s->w[i] & (~0ULL << (from % 64));

    for ( ;; ) {
        if (w) {
            return i * 64 + (unsigned) __builtin_ctzll(w);
        }

        if (++i == KVA_SLOT_WORDS) {
            return KVA_MAX_SLOTS;
        }

        w = s->w[i];
    }
}


#define kva_slotset_each(s, slot)                                             \
    for (slot = kva_slotset_next(s, 0); slot < KVA_MAX_SLOTS;                 \
         slot = kva_slotset_next(s, slot + 1))


#endif /* _KVA_SLOTSET_H_INCLUDED_ */
