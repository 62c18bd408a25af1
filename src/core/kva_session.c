/*
 * kva_session: the bindings of sessions to servers (see kva_session.h).
 *
 * Entries live in one array; a bucket holds the index of its first entry
 * and each entry the next of its chain; a doubly linked list through the
 * entries keeps them in order of use, so that the least recently used is
 * at hand for the sweep and for eviction.  Indices, not pointers: the
 * region may be mapped anywhere.
 */

#include <string.h>
#include <xxhash.h>

#include "kva_session.h"


static uint32_t kva_session_find(kva_session_t *t, uint64_t key);
static void kva_session_unlink(kva_session_t *t, uint32_t i);
static void kva_session_push(kva_session_t *t, uint32_t i);
static void kva_session_remove(kva_session_t *t, uint32_t i);
static int kva_session_idle(kva_session_entry_t *e, uint64_t now,
    uint64_t timeout);


static uint32_t
kva_session_buckets(uint32_t capacity)
{
    uint32_t  n;

    for (n = 1; n < capacity && n < (1u << 31); n <<= 1) {
        /* void */
    }

    return n;
}


size_t
kva_session_size(uint32_t capacity)
{
    return sizeof(kva_session_t) + 8
           + (size_t) kva_session_buckets(capacity) * sizeof(uint32_t)
           + (size_t) capacity * sizeof(kva_session_entry_t);
}


kva_session_t *
kva_session_init(void *mem, size_t size, uint32_t capacity)
{
    uint32_t        i, nb;
    uintptr_t       p;
    kva_session_t  *t;

    if (capacity == 0 || capacity >= KVA_SESSION_NIL
        || size < kva_session_size(capacity))
    {
        return NULL;
    }

    nb = kva_session_buckets(capacity);

    t = mem;
    memset(t, 0, sizeof(kva_session_t));

    t->capacity = capacity;
    t->mask = nb - 1;
    t->head = KVA_SESSION_NIL;
    t->tail = KVA_SESSION_NIL;

    /* the entries' 64-bit fields on an 8-byte boundary */
    p = ((uintptr_t) (t + 1) + 7) & ~(uintptr_t) 7;
    t->entries = (kva_session_entry_t *) p;
    t->buckets = (uint32_t *) (t->entries + capacity);

    memset(t->buckets, 0xff, (size_t) nb * sizeof(uint32_t));

    for (i = 0; i < capacity; i++) {
        t->entries[i].key = 0;
        t->entries[i].next = (i + 1 < capacity) ? i + 1 : KVA_SESSION_NIL;
    }

    t->free = 0;

    return t;
}


uint64_t
kva_session_key(kva_session_t *t, const void *data, size_t len)
{
    uint64_t  key;

    key = XXH3_64bits_withSeed(data, len, t->seed);

    return key ? key : 1;
}


kva_session_rc_e
kva_session_get(kva_session_t *t, uint64_t key, uint64_t now,
    uint64_t timeout, uint32_t *slot)
{
    uint32_t  i, n;

    /* the least recently used first: idle ones go, a few at a time */
    for (n = 0; n < KVA_SESSION_SWEEP && t->tail != KVA_SESSION_NIL; n++) {
        i = t->tail;

        if (!kva_session_idle(&t->entries[i], now, timeout)) {
            break;
        }

        if (t->entries[i].key == key) {
            kva_session_remove(t, i);
            t->expired++;
            return KVA_SESSION_EXPIRED;
        }

        kva_session_remove(t, i);
        t->expired++;
    }

    i = kva_session_find(t, key);

    if (i == KVA_SESSION_NIL) {
        return KVA_SESSION_NONE;
    }

    if (kva_session_idle(&t->entries[i], now, timeout)) {
        kva_session_remove(t, i);
        t->expired++;
        return KVA_SESSION_EXPIRED;
    }

    *slot = t->entries[i].slot;

    return KVA_SESSION_FOUND;
}


void
kva_session_bind(kva_session_t *t, uint64_t key, uint32_t slot, uint64_t now)
{
    uint32_t              i, b;
    kva_session_entry_t  *e;

    if (key == 0) {
        return;
    }

    i = kva_session_find(t, key);

    if (i != KVA_SESSION_NIL) {
        e = &t->entries[i];
        kva_session_unlink(t, i);

    } else {
        if (t->free == KVA_SESSION_NIL) {
            kva_session_remove(t, t->tail);
            t->evicted++;
        }

        i = t->free;
        e = &t->entries[i];
        t->free = e->next;

        e->key = key;
        e->used = now;
        b = (uint32_t) key & t->mask;
        e->chain = t->buckets[b];
        t->buckets[b] = i;
        t->used++;
    }

    e->slot = slot;

    /* a clock of another process a little behind never ages an entry */
    if (now > e->used) {
        e->used = now;
    }

    kva_session_push(t, i);
}


static uint32_t
kva_session_find(kva_session_t *t, uint64_t key)
{
    uint32_t  i;

    for (i = t->buckets[(uint32_t) key & t->mask];
         i != KVA_SESSION_NIL;
         i = t->entries[i].chain)
    {
        if (t->entries[i].key == key) {
            return i;
        }
    }

    return KVA_SESSION_NIL;
}


static int
kva_session_idle(kva_session_entry_t *e, uint64_t now, uint64_t timeout)
{
    return timeout && now > e->used && now - e->used > timeout;
}


/* out of the order of use */
static void
kva_session_unlink(kva_session_t *t, uint32_t i)
{
    kva_session_entry_t  *e;

    e = &t->entries[i];

    if (e->prev != KVA_SESSION_NIL) {
        t->entries[e->prev].next = e->next;

    } else {
        t->head = e->next;
    }

    if (e->next != KVA_SESSION_NIL) {
        t->entries[e->next].prev = e->prev;

    } else {
        t->tail = e->prev;
    }
}


/* in front, the most recently used */
static void
kva_session_push(kva_session_t *t, uint32_t i)
{
    kva_session_entry_t  *e;

    e = &t->entries[i];

    e->prev = KVA_SESSION_NIL;
    e->next = t->head;

    if (t->head != KVA_SESSION_NIL) {
        t->entries[t->head].prev = i;

    } else {
        t->tail = i;
    }

    t->head = i;
}


/* out of its bucket and the order of use, onto the free list */
static void
kva_session_remove(kva_session_t *t, uint32_t i)
{
    uint32_t             *link;
    kva_session_entry_t  *e;

    e = &t->entries[i];

    for (link = &t->buckets[(uint32_t) e->key & t->mask];
         *link != KVA_SESSION_NIL;
         link = &t->entries[*link].chain)
    {
        if (*link == i) {
            *link = e->chain;
            break;
        }
    }

    kva_session_unlink(t, i);

    e->key = 0;
    e->next = t->free;
    t->free = i;
    t->used--;
}
