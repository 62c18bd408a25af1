/*
 * kvbridge: one engine's cache, engine hash -> our key (kvb_mirror.h).
 *
 * An open-addressing table with linear probing and backward-shift
 * deletion: no tombstones, so a long-running engine that stores and
 * evicts forever keeps short probes.  It starts small and doubles when
 * half full: a mirror sized for max_blocks up front is 192 MB of pages
 * an engine may never fill (and a clear would have touched them all).
 * The slot comes from the engine hash times a random odd secret: an
 * engine's hashes are already uniform, the secret keeps a hostile
 * publisher on the engine's port from aiming at one run of slots.
 */

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <msgpack.h>

#include "kva_token.h"
#include "kvb_mirror.h"


/* the table's first size, 1024 slots (24 KB) */
#define KVB_MIRROR_MIN_BITS 10

/* groups told apart; a model has a handful */
#define KVB_GROUPS          64
/* (group, tier) pairs in a block's mask: 8 groups x 4 tiers */
#define KVB_GROUP_BITS      8
#define KVB_TIERS           4

#define KVB_KIND_FULL       0       /* also: not said yet */
#define KVB_KIND_OTHER      1


typedef struct {
    uint64_t                engine;
    uint64_t                key;
    uint32_t                mask;   /* 0: the slot is free */
} kvb_slot_t;


/* one change; its hashes are at an offset until the batch is handed out */
typedef struct {
    kva_ev_type_e           type;
    unsigned                has_parent:1;
    uint64_t                parent;
    size_t                  off;
    size_t                  n;
} kvb_change_t;


/* what one batch changes, grown as needed and reused */
typedef struct {
    kvb_change_t           *ev;
    size_t                  nev, ev_cap;
    uint64_t               *hashes;
    size_t                  nhashes, hashes_cap;
} kvb_changes_t;


struct kvb_mirror_s {
    kvb_slot_t             *slots;
    size_t                  cap;        /* a power of two */
    unsigned                shift;      /* 64 - log2(cap) */
    size_t                  count;
    size_t                  max;
    uint64_t                secret;     /* odd */
    uint64_t                root;       /* the base model's seed */
    uint8_t                 kind[KVB_GROUPS];

    kvb_mirror_stats_t      st;
    kvb_changes_t           ch;

    uint32_t               *ids;        /* one event's tokens */
    uint64_t               *keys;
    uint64_t               *extra;
    size_t                  ids_cap, keys_cap, extra_cap;
    msgpack_sbuffer         sb;         /* one block's extra keys, packed */
};


static kvb_slot_t *kvb_find(const kvb_mirror_t *m, uint64_t engine);
static int kvb_insert(kvb_mirror_t *m, uint64_t engine, uint64_t key,
    uint32_t bit);
static void kvb_delete(kvb_mirror_t *m, kvb_slot_t *s);
static int kvb_resize(kvb_mirror_t *m, unsigned bits);
static int kvb_stored(kvb_mirror_t *m, const kvb_ev_t *ev);
static void kvb_removed(kvb_mirror_t *m, const kvb_ev_t *ev);
static uint32_t kvb_bit(const kvb_ev_t *ev);
static uint64_t kvb_extra(kvb_mirror_t *m, const kvb_ev_t *ev,
    const msgpack_object *keys);
static int kvb_grow(void **p, size_t *cap, size_t need, size_t size);
static int kvb_change(kvb_mirror_t *m, kva_ev_type_e type, int has_parent,
    uint64_t parent);
static int kvb_change_hash(kvb_mirror_t *m, uint64_t key);


kvb_mirror_t *
kvb_mirror_create(const char *model, size_t max_blocks)
{
    kvb_mirror_t  *m;

    m = calloc(1, sizeof(kvb_mirror_t));
    if (m == NULL) {
        return NULL;
    }

    m->max = max_blocks;

    if (kvb_resize(m, KVB_MIRROR_MIN_BITS) != 0) {
        free(m);
        return NULL;
    }

    if (getrandom(&m->secret, sizeof(m->secret), 0)
        != (ssize_t) sizeof(m->secret))
    {
        m->secret = (uint64_t) (uintptr_t) m ^ 0x9e3779b97f4a7c15ULL;
    }

    m->secret |= 1;
    m->root = kva_token_seed((const uint8_t *) model, strlen(model));
    msgpack_sbuffer_init(&m->sb);

    return m;
}


void
kvb_mirror_destroy(kvb_mirror_t *m)
{
    if (m == NULL) {
        return;
    }

    msgpack_sbuffer_destroy(&m->sb);
    free(m->ch.ev);
    free(m->ch.hashes);
    free(m->ids);
    free(m->keys);
    free(m->extra);
    free(m->slots);
    free(m);
}


int
kvb_mirror_apply(kvb_mirror_t *m, const kvb_batch_t *in, kva_batch_t *out)
{
    size_t           i;
    const kvb_ev_t  *ev;

    m->ch.nev = 0;
    m->ch.nhashes = 0;

    for (i = 0; i < in->nevents; i++) {
        ev = &in->events[i];

        switch (ev->type) {

        case KVB_EV_STORED:
            if (kvb_stored(m, ev) != 0) {
                return -1;
            }

            break;

        case KVB_EV_REMOVED:
            kvb_removed(m, ev);
            break;

        case KVB_EV_CLEARED:
            kvb_mirror_clear(m);

            /* what came before in this batch is wiped too */
            m->ch.nev = 0;
            m->ch.nhashes = 0;

            if (kvb_change(m, KVA_EV_CLEARED, 0, 0) != 0) {
                return -1;
            }

            break;
        }
    }

    /* hand the changes over in the layout kva_batch_t owns */

    out->events = NULL;
    out->nevents = 0;
    out->hash_store = NULL;
    out->hash_count = 0;

    if (m->ch.nev == 0) {
        return 0;
    }

    out->events = malloc(m->ch.nev * sizeof(kva_ev_t));
    if (out->events == NULL) {
        return -1;
    }

    if (m->ch.nhashes) {
        out->hash_store = malloc(m->ch.nhashes * sizeof(uint64_t));
        if (out->hash_store == NULL) {
            free(out->events);
            out->events = NULL;
            return -1;
        }

        memcpy(out->hash_store, m->ch.hashes,
               m->ch.nhashes * sizeof(uint64_t));
    }

    for (i = 0; i < m->ch.nev; i++) {
        memset(&out->events[i], 0, sizeof(kva_ev_t));
        out->events[i].type = m->ch.ev[i].type;
        out->events[i].has_parent = m->ch.ev[i].has_parent;
        out->events[i].parent = m->ch.ev[i].parent;
        out->events[i].nhashes = m->ch.ev[i].n;
        out->events[i].hashes = m->ch.ev[i].n
                                ? out->hash_store + m->ch.ev[i].off : NULL;
    }

    out->nevents = m->ch.nev;
    out->hash_count = m->ch.nhashes;

    return 0;
}


void
kvb_mirror_clear(kvb_mirror_t *m)
{
    kvb_slot_t  *small;

    m->count = 0;

    /* back to the first size, or, without memory for it, emptied */

    small = calloc((size_t) 1 << KVB_MIRROR_MIN_BITS, sizeof(kvb_slot_t));

    if (small != NULL) {
        free(m->slots);
        m->slots = small;
        m->cap = (size_t) 1 << KVB_MIRROR_MIN_BITS;
        m->shift = 64 - KVB_MIRROR_MIN_BITS;

    } else {
        memset(m->slots, 0, m->cap * sizeof(kvb_slot_t));
    }

    memset(m->kind, 0, sizeof(m->kind));
    m->st.clears++;
}


size_t
kvb_mirror_size(const kvb_mirror_t *m)
{
    return m->count;
}


size_t
kvb_mirror_keys(const kvb_mirror_t *m, size_t *cursor, uint64_t *out,
    size_t max)
{
    size_t  n, i;

    n = 0;

    for (i = *cursor; i < m->cap && n < max; i++) {
        if (m->slots[i].mask) {
            out[n++] = m->slots[i].key;
        }
    }

    *cursor = i;

    return n;
}


const kvb_mirror_stats_t *
kvb_mirror_stats(const kvb_mirror_t *m)
{
    return &m->st;
}


static int
kvb_stored(kvb_mirror_t *m, const kvb_ev_t *ev)
{
    int          has_parent, opened;
    size_t       i, n;
    uint32_t     bit, g;
    uint64_t     seed, engine;
    kvb_slot_t  *s;

    g = ev->has_group ? (uint32_t) ev->group_idx : 0;

    if (g < KVB_GROUPS && ev->spec_kind.data != NULL) {
        m->kind[g] = (ev->spec_kind.len == 14
                      && memcmp(ev->spec_kind.data, "full_attention", 14)
                         == 0)
                     ? KVB_KIND_FULL : KVB_KIND_OTHER;
    }

    if (g < KVB_GROUPS && m->kind[g] == KVB_KIND_OTHER) {
        m->st.skipped_group += ev->nhashes;
        return 0;
    }

    if (ev->nhashes == 0) {
        return 0;
    }

    has_parent = 0;

    if (ev->has_parent) {
        s = kvb_find(m, ev->parent);

        if (s == NULL) {
            /* the chain is broken: these blocks cannot be keyed */
            m->st.orphans += ev->nhashes;
            return 0;
        }

        seed = s->key;
        has_parent = 1;

    } else if (ev->lora_name.data != NULL) {
        seed = kva_token_seed((const uint8_t *) ev->lora_name.data,
                              ev->lora_name.len);

    } else {
        seed = m->root;
    }

    if (kvb_grow((void **) &m->ids, &m->ids_cap, ev->ntokens,
                 sizeof(uint32_t)) != 0
        || kvb_grow((void **) &m->keys, &m->keys_cap, ev->nhashes,
                    sizeof(uint64_t)) != 0
        || kvb_grow((void **) &m->extra, &m->extra_cap, ev->nhashes,
                    sizeof(uint64_t)) != 0)
    {
        return -1;
    }

    for (i = 0; i < ev->ntokens; i++) {
        m->ids[i] = (uint32_t) ev->tokens[i].via.u64;
    }

    for (i = 0; i < ev->nhashes; i++) {
        m->extra[i] = ev->extra_keys
                ? kvb_extra(m, ev, &ev->extra_keys->via.array.ptr[i]) : 0;
    }

    n = kva_token_blocks(seed, m->ids, ev->ntokens, ev->block_size,
                         m->extra, m->keys, ev->nhashes);

    bit = kvb_bit(ev);
    opened = 0;

    for (i = 0; i < n; i++) {
        (void) kvb_engine_hash(&ev->hashes[i], &engine);

        s = kvb_find(m, engine);

        if (s != NULL) {
            s->mask |= bit;
            continue;
        }

        if (m->count >= m->max) {
            m->st.full += n - i;
            break;
        }

        if (!opened) {
            /* one stored event: the blocks new to the module */
            if (kvb_change(m, KVA_EV_STORED, has_parent || i > 0,
                           i == 0 ? seed : m->keys[i - 1])
                != 0)
            {
                return -1;
            }

            opened = 1;
        }

        if (kvb_insert(m, engine, m->keys[i], bit) != 0
            || kvb_change_hash(m, m->keys[i]) != 0)
        {
            return -1;
        }

        m->st.stored++;
    }

    return 0;
}


static void
kvb_removed(kvb_mirror_t *m, const kvb_ev_t *ev)
{
    int          opened;
    uint32_t     i, bit, g;
    uint64_t     engine;
    kvb_slot_t  *s;

    g = ev->has_group ? (uint32_t) ev->group_idx : 0;

    if (g < KVB_GROUPS && m->kind[g] == KVB_KIND_OTHER) {
        m->st.skipped_group += ev->nhashes;
        return;
    }

    bit = kvb_bit(ev);
    opened = 0;

    for (i = 0; i < ev->nhashes; i++) {
        (void) kvb_engine_hash(&ev->hashes[i], &engine);

        s = kvb_find(m, engine);
        if (s == NULL) {
            continue;
        }

        s->mask &= ~bit;

        if (s->mask) {
            /* another tier or group still holds it */
            continue;
        }

        if (!opened) {
            if (kvb_change(m, KVA_EV_REMOVED, 0, 0) != 0) {
                /* out of memory: the module keeps a stale block */
                s->mask = bit;
                return;
            }

            opened = 1;
        }

        if (kvb_change_hash(m, s->key) != 0) {
            s->mask = bit;
            return;
        }

        kvb_delete(m, s);
        m->st.removed++;
    }
}


/* the block's (group, tier) bit */

static uint32_t
kvb_bit(const kvb_ev_t *ev)
{
    uint32_t  g, tier;

    g = ev->has_group ? (uint32_t) ev->group_idx : 0;
    g = (g < KVB_GROUP_BITS) ? g : KVB_GROUP_BITS - 1;

    if (ev->medium.data == NULL
        || (ev->medium.len == 3 && memcmp(ev->medium.data, "GPU", 3) == 0))
    {
        tier = 0;

    } else if (ev->medium.len == 3
               && memcmp(ev->medium.data, "CPU", 3) == 0)
    {
        tier = 1;

    } else {
        /* disk, a remote store: told apart from each other by length */
        tier = 2 + (ev->medium.len & 1);
    }

    return (uint32_t) 1 << (g * KVB_TIERS + tier);
}


/*
 * One block's extra keys as a value for kva_token_blocks(): 0 when there
 * are none once the LoRA adapter's own entry (vLLM lists the adapter's
 * name, older releases its id, first) is taken out, else the hash of the
 * rest packed as a msgpack array.
 */

static uint64_t
kvb_extra(kvb_mirror_t *m, const kvb_ev_t *ev, const msgpack_object *keys)
{
    uint32_t               first, i;
    msgpack_packer         pk;
    const msgpack_object  *k;

    if (keys->type != MSGPACK_OBJECT_ARRAY || keys->via.array.size == 0) {
        return 0;
    }

    first = 0;
    k = &keys->via.array.ptr[0];

    if ((ev->lora_name.data != NULL
         && (k->type == MSGPACK_OBJECT_STR || k->type == MSGPACK_OBJECT_BIN)
         && k->via.str.size == ev->lora_name.len
         && memcmp(k->via.str.ptr, ev->lora_name.data, ev->lora_name.len)
            == 0)
        || (ev->has_lora_id && k->type == MSGPACK_OBJECT_POSITIVE_INTEGER
            && (int64_t) k->via.u64 == ev->lora_id))
    {
        first = 1;
    }

    if (first == keys->via.array.size) {
        return 0;
    }

    msgpack_sbuffer_clear(&m->sb);
    msgpack_packer_init(&pk, &m->sb, msgpack_sbuffer_write);

    if (msgpack_pack_array(&pk, keys->via.array.size - first) != 0) {
        return 1;
    }

    for (i = first; i < keys->via.array.size; i++) {
        if (msgpack_pack_object(&pk, keys->via.array.ptr[i]) != 0) {
            /* out of memory: still not a plain block */
            return 1;
        }
    }

    return kva_token_extra((const uint8_t *) m->sb.data, m->sb.size);
}


static kvb_slot_t *
kvb_find(const kvb_mirror_t *m, uint64_t engine)
{
    size_t       i;
    kvb_slot_t  *s;

    i = (size_t) ((engine * m->secret) >> m->shift);

    for ( ;; ) {
        s = &m->slots[i];

        if (s->mask == 0) {
            return NULL;
        }

        if (s->engine == engine) {
            return s;
        }

        i = (i + 1) & (m->cap - 1);
    }
}


static int
kvb_insert(kvb_mirror_t *m, uint64_t engine, uint64_t key, uint32_t bit)
{
    size_t       i;
    unsigned     bits;
    kvb_slot_t  *s;

    if (2 * (m->count + 1) > m->cap) {
        for (bits = 0; ((size_t) 1 << bits) < m->cap; bits++) {
            /* void */
        }

        if (kvb_resize(m, bits + 1) != 0) {
            return -1;
        }
    }

    i = (size_t) ((engine * m->secret) >> m->shift);

    /* the table is at most half full: a free slot is near */

    for ( ;; ) {
        s = &m->slots[i];

        if (s->mask == 0) {
            s->engine = engine;
            s->key = key;
            s->mask = bit;
            m->count++;
            return 0;
        }

        i = (i + 1) & (m->cap - 1);
    }
}


/*
 * A table of 2^bits slots with every entry of the current one moved in,
 * in place of it.  A snapshot walking
 * the slots meanwhile may miss entries that moved behind its cursor: they
 * are blocks nginx already heard of, counted again at the next resync.
 */

static int
kvb_resize(kvb_mirror_t *m, unsigned bits)
{
    size_t       i, j, cap;
    kvb_slot_t  *slots, *old;

    cap = (size_t) 1 << bits;

    slots = calloc(cap, sizeof(kvb_slot_t));
    if (slots == NULL) {
        return -1;
    }

    old = m->slots;

    for (i = 0; old != NULL && i < m->cap; i++) {
        if (old[i].mask == 0) {
            continue;
        }

        j = (size_t) ((old[i].engine * m->secret) >> (64 - bits));

        while (slots[j].mask) {
            j = (j + 1) & (cap - 1);
        }

        slots[j] = old[i];
    }

    free(old);

    m->slots = slots;
    m->cap = cap;
    m->shift = 64 - bits;

    return 0;
}


/*
 * Backward-shift deletion: every entry after the hole that probed past it
 * moves into it, so lookups stop at the first free slot as before.
 */

static void
kvb_delete(kvb_mirror_t *m, kvb_slot_t *s)
{
    size_t  hole, i, home, mask;

    mask = m->cap - 1;
    hole = (size_t) (s - m->slots);
    i = hole;

    for ( ;; ) {
        i = (i + 1) & mask;

        if (m->slots[i].mask == 0) {
            break;
        }

        home = (size_t) ((m->slots[i].engine * m->secret) >> m->shift);

        /* can the entry at i live at the hole?  (cyclic distance) */

        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->slots[hole] = m->slots[i];
            hole = i;
        }
    }

    m->slots[hole].mask = 0;
    m->count--;
}


static int
kvb_grow(void **p, size_t *cap, size_t need, size_t size)
{
    size_t   n;
    void    *q;

    if (need <= *cap) {
        return 0;
    }

    n = (*cap ? *cap : 64);

    while (n < need) {
        n *= 2;
    }

    q = realloc(*p, n * size);
    if (q == NULL) {
        return -1;
    }

    *p = q;
    *cap = n;

    return 0;
}


static int
kvb_change(kvb_mirror_t *m, kva_ev_type_e type, int has_parent,
    uint64_t parent)
{
    kvb_change_t  *ev;

    if (kvb_grow((void **) &m->ch.ev, &m->ch.ev_cap, m->ch.nev + 1,
                 sizeof(kvb_change_t)) != 0)
    {
        return -1;
    }

    ev = &m->ch.ev[m->ch.nev++];
    ev->type = type;
    ev->has_parent = has_parent ? 1 : 0;
    ev->parent = parent;
    ev->off = m->ch.nhashes;
    ev->n = 0;

    return 0;
}


static int
kvb_change_hash(kvb_mirror_t *m, uint64_t key)
{
    if (kvb_grow((void **) &m->ch.hashes, &m->ch.hashes_cap,
                 m->ch.nhashes + 1, sizeof(uint64_t)) != 0)
    {
        return -1;
    }

    m->ch.hashes[m->ch.nhashes++] = key;
    m->ch.ev[m->ch.nev - 1].n++;

    return 0;
}
