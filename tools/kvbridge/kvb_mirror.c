/*
 * kvbridge: one engine's cache, engine hash -> our key (kvb_mirror.h).
 *
 * Blocks: an open-addressing table with linear probing and backward-shift
 * deletion: no tombstones, so a long-running engine that stores and
 * evicts forever keeps short probes.  It starts small and doubles when
 * half full: a mirror sized for max_blocks up front is 192 MB of pages
 * an engine may never fill (and a clear would have touched them all).
 * The slot comes from the engine hash times a random odd secret: an
 * engine's hashes are already uniform, the secret keeps a hostile
 * publisher on the engine's port from aiming at one run of slots.
 *
 * A block's first holder and its copies live in its slot; further
 * holders (an offload tier, a second dense group) in a pool of records.
 *
 * Keys: what nginx holds, each with the count of blocks that have it, in
 * a dense array (what a snapshot walks) with an index of positions.  The
 * array is cut at the snapshot's position: a removal refills a hole from
 * its own side, an insertion lands on the side already sent, so no key
 * crosses the position while a snapshot walks it.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <msgpack.h>

#include "kva_token.h"
#include "kvb_mirror.h"


/* the tables' first size, 1024 slots (24 KB) */
#define KVB_MIRROR_MIN_BITS 10

/* (group, medium) pairs told apart, and groups; a model has a handful */
#define KVB_HOLDERS_MAX     64
#define KVB_GROUPS_MAX      32
#define KVB_MEDIUM_MAX      32

/* a holder's copies of one block: vLLM makes one a running request */
#define KVB_COPIES_MAX      UINT16_MAX

#define KVB_KIND_DENSE      0       /* also: not said yet */
#define KVB_KIND_SLIDING    1
#define KVB_KIND_MAMBA      2
#define KVB_KIND_OTHER      3

#define KVB_SLOT_USED       0x01
#define KVB_SLOT_HIDDEN     0x02    /* an adapter known by id: not sent */


typedef struct {
    uint64_t                engine;
    uint64_t                key;
    uint32_t                more;   /* further holders: record + 1 */
    uint16_t                copies; /* the first holder's, >= 1 */
    uint8_t                 holder;
    uint8_t                 flags;  /* 0: the slot is free */
} kvb_slot_t;


typedef struct {
    uint32_t                next;   /* record + 1, 0: the last */
    uint16_t                copies;
    uint8_t                 holder;
    uint8_t                 unused;
} kvb_hold_t;


typedef struct {
    int64_t                 group;
    uint32_t                len;
    uint8_t                 tier;   /* KVA_EVENT_TIER_*, of its medium */
    char                    medium[KVB_MEDIUM_MAX];
} kvb_holder_t;


typedef struct {
    int64_t                 group;
    uint8_t                 kind;
} kvb_group_t;


/*
 * A key's tier is that of its fastest block, a block's that of its
 * fastest holder: the blocks with this key in GPU and in host memory are
 * counted, the rest are slower.
 */
typedef struct {
    uint64_t                key;
    uint64_t                refs;   /* blocks with this key */
    uint32_t                fast[2];    /* of them in GPU, host memory */
} kvb_key_t;


/* one change; its hashes are at an offset until the batch is handed out */
typedef struct {
    kva_ev_type_e           type;
    unsigned                has_parent:1;
    unsigned                tier:2;     /* stored: KVA_EVENT_TIER_* */
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

    kvb_hold_t             *pool;
    size_t                  pool_n, pool_cap;
    uint32_t                pool_free;  /* record + 1 */

    kvb_key_t              *keyv;       /* dense */
    size_t                  nkeys, keyv_cap;
    uint32_t               *kidx;       /* position + 1, 0: free */
    size_t                  kcap;
    unsigned                kshift;

    /* the snapshot: keys before snap_pos are sent */
    size_t                  snap_pos;
    size_t                  snap_id;
    unsigned                snap_live:1;

    kvb_holder_t            holders[KVB_HOLDERS_MAX];
    unsigned                nholders;
    kvb_group_t             groups[KVB_GROUPS_MAX];
    unsigned                ngroups;

    kvb_mirror_stats_t      st;
    kvb_changes_t           ch;

    uint32_t               *ids;        /* one event's tokens */
    uint64_t               *keys;
    uint64_t               *extra;
    size_t                  ids_cap, keys_cap, extra_cap;
    msgpack_sbuffer         sb;         /* one block's extra keys, packed */
};


static int kvb_stored(kvb_mirror_t *m, const kvb_ev_t *ev);
static int kvb_stored_hashes(kvb_mirror_t *m, const kvb_ev_t *ev,
    unsigned holder);
static void kvb_removed(kvb_mirror_t *m, const kvb_ev_t *ev);
static kvb_group_t *kvb_group(kvb_mirror_t *m, const kvb_ev_t *ev,
    int create);
static uint8_t kvb_kind(const kvb_str_t *kind);
static int kvb_str_eq(const kvb_str_t *s, const char *lit);
static int kvb_skip_kind(kvb_mirror_t *m, const kvb_group_t *g, size_t n);
static int kvb_holder(kvb_mirror_t *m, const kvb_ev_t *ev, int create);
static uint64_t kvb_extra(kvb_mirror_t *m, const kvb_ev_t *ev,
    const msgpack_object *keys);

static kvb_slot_t *kvb_find(const kvb_mirror_t *m, uint64_t engine);
static kvb_slot_t *kvb_insert(kvb_mirror_t *m, uint64_t engine);
static void kvb_delete(kvb_mirror_t *m, kvb_slot_t *s);
static int kvb_resize(kvb_mirror_t *m, unsigned bits);
static int kvb_hold_add(kvb_mirror_t *m, kvb_slot_t *s, unsigned holder);
static int kvb_hold_add_tiered(kvb_mirror_t *m, kvb_slot_t *s,
    unsigned holder);
static int kvb_hold_del(kvb_mirror_t *m, kvb_slot_t *s, unsigned holder);
static void kvb_hold_free_all(kvb_mirror_t *m, kvb_slot_t *s);

static uint8_t kvb_medium_tier(const char *medium, uint32_t len);
static unsigned kvb_block_tier(const kvb_mirror_t *m, const kvb_slot_t *s);
static unsigned kvb_key_tier(const kvb_key_t *k);
static void kvb_key_retier(kvb_mirror_t *m, uint64_t key, unsigned from,
    unsigned to);

static int kvb_key_ref(kvb_mirror_t *m, uint64_t key, unsigned tier);
static int kvb_key_unref(kvb_mirror_t *m, uint64_t key, unsigned tier);
static uint32_t *kvb_key_slot(const kvb_mirror_t *m, uint64_t key);
static uint32_t *kvb_key_slot_of(const kvb_mirror_t *m, size_t pos);
static void kvb_key_swap(kvb_mirror_t *m, size_t a, size_t b);
static void kvb_key_drop_last(kvb_mirror_t *m);
static int kvb_key_resize(kvb_mirror_t *m, unsigned bits);

static int kvb_grow(void **p, size_t *cap, size_t need, size_t size);
static void kvb_emit(kvb_mirror_t *m, kva_ev_type_e type, unsigned tier,
    uint64_t key, int has_parent, uint64_t parent);
static void kvb_change(kvb_mirror_t *m, kva_ev_type_e type, int has_parent,
    uint64_t parent);


kvb_mirror_t *
kvb_mirror_create(const char *model, size_t max_blocks)
{
    kvb_mirror_t  *m;

    m = calloc(1, sizeof(kvb_mirror_t));
    if (m == NULL) {
        return NULL;
    }

    m->max = max_blocks;

    if (getrandom(&m->secret, sizeof(m->secret), 0)
        != (ssize_t) sizeof(m->secret))
    {
        m->secret = (uint64_t) (uintptr_t) m ^ 0x9e3779b97f4a7c15ULL;
    }

    m->secret |= 1;

    if (kvb_resize(m, KVB_MIRROR_MIN_BITS) != 0
        || kvb_key_resize(m, KVB_MIRROR_MIN_BITS) != 0)
    {
        free(m->slots);
        free(m);
        return NULL;
    }

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
    free(m->pool);
    free(m->keyv);
    free(m->kidx);
    free(m);
}


int
kvb_mirror_apply(kvb_mirror_t *m, const kvb_batch_t *in, kva_batch_t *out)
{
    size_t           i, need;
    const kvb_ev_t  *ev;

    m->ch.nev = 0;
    m->ch.nhashes = 0;

    /*
     * An engine hash makes one change's hash at most (a key new, gone, or
     * moved to another tier), and each may open a change: room for them
     * all up front, so that a removal never stops half way for memory.
     */

    need = 0;

    for (i = 0; i < in->nevents; i++) {
        need += in->events[i].nhashes;
    }

    if (kvb_grow((void **) &m->ch.ev, &m->ch.ev_cap, in->nevents + need + 1,
                 sizeof(kvb_change_t)) != 0
        || kvb_grow((void **) &m->ch.hashes, &m->ch.hashes_cap, need + 1,
                    sizeof(uint64_t)) != 0)
    {
        return -1;
    }

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
            kvb_change(m, KVA_EV_CLEARED, 0, 0);
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
        out->events[i].tier = m->ch.ev[i].tier;
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
    uint32_t    *kidx;

    m->count = 0;
    m->nkeys = 0;
    m->pool_n = 0;
    m->pool_free = 0;

    /* a snapshot under way goes on, over what comes from now on */
    m->snap_pos = 0;

    /* back to the first sizes, or, without memory for them, emptied */

    small = calloc((size_t) 1 << KVB_MIRROR_MIN_BITS, sizeof(kvb_slot_t));

    if (small != NULL) {
        free(m->slots);
        m->slots = small;
        m->cap = (size_t) 1 << KVB_MIRROR_MIN_BITS;
        m->shift = 64 - KVB_MIRROR_MIN_BITS;

    } else {
        memset(m->slots, 0, m->cap * sizeof(kvb_slot_t));
    }

    kidx = calloc((size_t) 1 << KVB_MIRROR_MIN_BITS, sizeof(uint32_t));

    if (kidx != NULL) {
        free(m->kidx);
        m->kidx = kidx;
        m->kcap = (size_t) 1 << KVB_MIRROR_MIN_BITS;
        m->kshift = 64 - KVB_MIRROR_MIN_BITS;

    } else {
        memset(m->kidx, 0, m->kcap * sizeof(uint32_t));
    }

    free(m->pool);
    m->pool = NULL;
    m->pool_cap = 0;
    free(m->keyv);
    m->keyv = NULL;
    m->keyv_cap = 0;

    m->nholders = 0;
    m->ngroups = 0;
    m->st.clears++;
}


size_t
kvb_mirror_size(const kvb_mirror_t *m)
{
    return m->count;
}


size_t
kvb_mirror_nkeys(const kvb_mirror_t *m)
{
    return m->nkeys;
}


size_t
kvb_mirror_keys(kvb_mirror_t *m, size_t *cursor, uint64_t *out, size_t max)
{
    return kvb_mirror_keys_tiered(m, cursor, out, NULL, max);
}


size_t
kvb_mirror_keys_tiered(kvb_mirror_t *m, size_t *cursor, uint64_t *out,
    uint8_t *tiers, size_t max)
{
    size_t  n;

    if (*cursor == 0) {
        m->snap_id++;
        m->snap_id += (m->snap_id == 0);
        m->snap_pos = 0;
        m->snap_live = 1;

    } else if (*cursor != m->snap_id || !m->snap_live) {
        /* a snapshot that ended, or that a newer one ended */
        return 0;
    }

    *cursor = m->snap_id;

    for (n = 0; n < max && m->snap_pos < m->nkeys; n++) {
        if (tiers) {
            tiers[n] = (uint8_t) kvb_key_tier(&m->keyv[m->snap_pos]);
        }

        out[n] = m->keyv[m->snap_pos++].key;
    }

    if (n < max) {
        m->snap_live = 0;
    }

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
    int           holder;
    uint32_t      i;
    uint64_t      engine;
    kvb_slot_t   *s;
    kvb_group_t  *g;

    g = kvb_group(m, ev, 1);

    if (g == NULL) {
        m->st.holders_full += ev->nhashes;
        return 0;
    }

    if (ev->spec_kind.data != NULL) {
        g->kind = kvb_kind(&ev->spec_kind);
    }

    if (kvb_skip_kind(m, g, ev->nhashes)) {
        return 0;
    }

    if (ev->nhashes == 0) {
        return 0;
    }

    holder = kvb_holder(m, ev, 1);

    if (holder < 0) {
        m->st.holders_full += ev->nhashes;
        return 0;
    }

    if (ev->ntokens) {
        return kvb_stored_hashes(m, ev, (unsigned) holder);
    }

    /*
     * An offload tier's event without tokens (block_size 0): the engine's
     * hash is all it says.  It adds a holder to a block the mirror knows;
     * any other cannot be keyed.
     */

    for (i = 0; i < ev->nhashes; i++) {
        (void) kvb_engine_hash(&ev->hashes[i], &engine);

        s = kvb_find(m, engine);

        if (s == NULL) {
            m->st.untokened++;
            continue;
        }

        if (kvb_hold_add_tiered(m, s, (unsigned) holder) != 0) {
            return -1;
        }
    }

    return 0;
}


/* a stored event with its tokens: each block keyed, the new ones sent */

static int
kvb_stored_hashes(kvb_mirror_t *m, const kvb_ev_t *ev, unsigned holder)
{
    int          has_parent, hidden, rc;
    char         buf[48];
    size_t       i, n;
    unsigned     tier;
    uint64_t     seed, engine;
    kvb_slot_t  *s;

    has_parent = 0;
    hidden = 0;

    if (ev->has_parent) {
        s = kvb_find(m, ev->parent);

        if (s == NULL) {
            /* the chain is broken: these blocks cannot be keyed */
            m->st.orphans += ev->nhashes;
            return 0;
        }

        seed = s->key;
        has_parent = 1;
        hidden = (s->flags & KVB_SLOT_HIDDEN) != 0;

    } else if (ev->lora_name.data != NULL) {
        seed = kva_token_seed((const uint8_t *) ev->lora_name.data,
                              ev->lora_name.len);

    } else if (ev->has_lora_id) {
        /*
         * An adapter nginx cannot name: a seed no model name gives (it
         * starts with a zero byte), and never sent.
         */
        n = (size_t) snprintf(buf, sizeof(buf), "%clora_id=%" PRId64, 0,
                              ev->lora_id);
        seed = kva_token_seed((const uint8_t *) buf, n);
        hidden = 1;

    } else {
        seed = m->root;
    }

    if (ev->has_lora_id && ev->lora_name.data == NULL) {
        hidden = 1;
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

    for (i = 0; i < n; i++) {
        (void) kvb_engine_hash(&ev->hashes[i], &engine);

        s = kvb_find(m, engine);

        if (s != NULL) {
            /* another copy, or another holder, of a block held */
            if (kvb_hold_add_tiered(m, s, holder) != 0) {
                return -1;
            }

            continue;
        }

        if (m->count >= m->max) {
            m->st.full += n - i;
            break;
        }

        s = kvb_insert(m, engine);
        if (s == NULL) {
            return -1;
        }

        s->key = m->keys[i];
        s->holder = (uint8_t) holder;
        s->copies = 1;
        s->flags = KVB_SLOT_USED | (hidden ? KVB_SLOT_HIDDEN : 0);

        if (hidden) {
            m->st.lora_unnamed++;
            continue;
        }

        tier = m->holders[holder].tier;
        rc = kvb_key_ref(m, m->keys[i], tier);

        if (rc < 0) {
            kvb_delete(m, s);
            return -1;
        }

        if (rc != 1) {
            /* nginx has the key from another block: at its tier, or ours */
            m->st.shared_keys++;

            if (rc == 2) {
                kvb_emit(m, KVA_EV_STORED, tier, m->keys[i], 0, 0);
            }

            continue;
        }

        /* one stored event, as a rule: the keys new to the module */
        kvb_emit(m, KVA_EV_STORED, tier, m->keys[i], has_parent || i > 0,
                 i == 0 ? seed : m->keys[i - 1]);
        m->st.stored++;
    }

    return 0;
}


static void
kvb_removed(kvb_mirror_t *m, const kvb_ev_t *ev)
{
    int           holder, rc;
    uint32_t      i;
    unsigned      tier, after;
    uint64_t      engine;
    kvb_slot_t   *s;
    kvb_group_t  *g;

    g = kvb_group(m, ev, 0);

    if (g != NULL && kvb_skip_kind(m, g, ev->nhashes)) {
        return;
    }

    holder = kvb_holder(m, ev, 0);

    if (holder < 0) {
        /* a holder that never stored anything holds nothing */
        return;
    }

    for (i = 0; i < ev->nhashes; i++) {
        (void) kvb_engine_hash(&ev->hashes[i], &engine);

        s = kvb_find(m, engine);
        if (s == NULL) {
            continue;
        }

        tier = kvb_block_tier(m, s);

        if (kvb_hold_del(m, s, (unsigned) holder) != 0) {
            /*
             * another copy, tier or group still holds it: if its GPU copy
             * went and a slower one stays, nginx hears the slower tier
             */
            after = kvb_block_tier(m, s);

            if (after != tier && !(s->flags & KVB_SLOT_HIDDEN)) {
                kvb_key_retier(m, s->key, tier, after);
            }

            continue;
        }

        if (!(s->flags & KVB_SLOT_HIDDEN)) {
            rc = kvb_key_unref(m, s->key, tier);

            if (rc == 1) {
                kvb_emit(m, KVA_EV_REMOVED, 0, s->key, 0, 0);
                m->st.removed++;

            } else if (rc == 2) {
                /* the key's fastest block went, another stays */
                kvb_emit(m, KVA_EV_STORED, kvb_key_tier(
                             &m->keyv[*kvb_key_slot(m, s->key) - 1]),
                         s->key, 0, 0);
            }
        }

        kvb_delete(m, s);
    }
}


/* the event's group, found or (create) added; NULL: too many groups */

static kvb_group_t *
kvb_group(kvb_mirror_t *m, const kvb_ev_t *ev, int create)
{
    unsigned      i;
    int64_t       idx;
    kvb_group_t  *g;

    idx = ev->has_group ? ev->group_idx : 0;

    for (i = 0; i < m->ngroups; i++) {
        if (m->groups[i].group == idx) {
            return &m->groups[i];
        }
    }

    if (!create || m->ngroups == KVB_GROUPS_MAX) {
        return NULL;
    }

    g = &m->groups[m->ngroups++];
    g->group = idx;
    g->kind = KVB_KIND_DENSE;

    return g;
}


/*
 * vLLM's KVCacheSpecKind: the dense kinds keep a prefix reusable, as
 * llm-d's indexer admits them; any kind not known is not taken as dense.
 */

static uint8_t
kvb_kind(const kvb_str_t *kind)
{
    if (kvb_str_eq(kind, "full_attention")
        || kvb_str_eq(kind, "mla_attention")
        || kvb_str_eq(kind, "sink_full_attention"))
    {
        return KVB_KIND_DENSE;
    }

    if (kvb_str_eq(kind, "sliding_window")
        || kvb_str_eq(kind, "sliding_window_mla")
        || kvb_str_eq(kind, "chunked_local_attention"))
    {
        return KVB_KIND_SLIDING;
    }

    if (kvb_str_eq(kind, "mamba")) {
        return KVB_KIND_MAMBA;
    }

    return KVB_KIND_OTHER;
}


static int
kvb_str_eq(const kvb_str_t *s, const char *lit)
{
    size_t  n;

    n = strlen(lit);

    return s->len == n && memcmp(s->data, lit, n) == 0;
}


/* counts n blocks of a group that does not keep a prefix; 1 if it is one */

static int
kvb_skip_kind(kvb_mirror_t *m, const kvb_group_t *g, size_t n)
{
    switch (g->kind) {

    case KVB_KIND_DENSE:
        return 0;

    case KVB_KIND_SLIDING:
        m->st.skipped_sliding += n;
        break;

    case KVB_KIND_MAMBA:
        m->st.skipped_mamba += n;
        break;

    default:
        m->st.skipped_kind += n;
        break;
    }

    m->st.skipped_group += n;

    return 1;
}


/*
 * The event's holder, its (group, medium) by their whole values: no
 * medium is the GPU.  Returns its number, -1 if not known (or, with
 * create, past KVB_HOLDERS_MAX or a medium name longer than any tier's).
 */

static int
kvb_holder(kvb_mirror_t *m, const kvb_ev_t *ev, int create)
{
    unsigned       i;
    int64_t        group;
    uint32_t       len;
    const char    *medium;
    kvb_holder_t  *h;

    group = ev->has_group ? ev->group_idx : 0;
    medium = ev->medium.data ? ev->medium.data : "GPU";
    len = ev->medium.data ? ev->medium.len : 3;

    for (i = 0; i < m->nholders; i++) {
        h = &m->holders[i];

        if (h->group == group && h->len == len
            && memcmp(h->medium, medium, len) == 0)
        {
            return (int) i;
        }
    }

    if (!create || m->nholders == KVB_HOLDERS_MAX || len > KVB_MEDIUM_MAX) {
        return -1;
    }

    h = &m->holders[m->nholders];
    h->group = group;
    h->len = len;
    h->tier = kvb_medium_tier(medium, len);
    memcpy(h->medium, medium, len);

    return (int) m->nholders++;
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

        if (s->flags == 0) {
            return NULL;
        }

        if (s->engine == engine) {
            return s;
        }

        i = (i + 1) & (m->cap - 1);
    }
}


/* a free slot for a block not held, its engine hash set, or NULL */

static kvb_slot_t *
kvb_insert(kvb_mirror_t *m, uint64_t engine)
{
    size_t       i;
    kvb_slot_t  *s;

    if (2 * (m->count + 1) > m->cap
        && kvb_resize(m, 65 - m->shift) != 0)
    {
        return NULL;
    }

    i = (size_t) ((engine * m->secret) >> m->shift);

    /* the table is at most half full: a free slot is near */

    for ( ;; ) {
        s = &m->slots[i];

        if (s->flags == 0) {
            memset(s, 0, sizeof(kvb_slot_t));
            s->engine = engine;
            m->count++;
            return s;
        }

        i = (i + 1) & (m->cap - 1);
    }
}


/* a table of 2^bits slots with every entry of the current one moved in */

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
        if (old[i].flags == 0) {
            continue;
        }

        j = (size_t) ((old[i].engine * m->secret) >> (64 - bits));

        while (slots[j].flags) {
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
 * moves into it, so lookups stop at the first free slot as before.  The
 * block's holder records go back to the pool.
 */

static void
kvb_delete(kvb_mirror_t *m, kvb_slot_t *s)
{
    size_t  hole, i, home, mask;

    kvb_hold_free_all(m, s);

    mask = m->cap - 1;
    hole = (size_t) (s - m->slots);
    i = hole;

    for ( ;; ) {
        i = (i + 1) & mask;

        if (m->slots[i].flags == 0) {
            break;
        }

        home = (size_t) ((m->slots[i].engine * m->secret) >> m->shift);

        /* can the entry at i live at the hole?  (cyclic distance) */

        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->slots[hole] = m->slots[i];
            hole = i;
        }
    }

    m->slots[hole].flags = 0;
    m->count--;
}


/* hold_add, and nginx told when the holder is faster than the others */

static int
kvb_hold_add_tiered(kvb_mirror_t *m, kvb_slot_t *s, unsigned holder)
{
    unsigned  tier, after;

    tier = kvb_block_tier(m, s);

    if (kvb_hold_add(m, s, holder) != 0) {
        return -1;
    }

    after = kvb_block_tier(m, s);

    if (after != tier && !(s->flags & KVB_SLOT_HIDDEN)) {
        kvb_key_retier(m, s->key, tier, after);
    }

    return 0;
}


/* one more copy of the block for the holder */

static int
kvb_hold_add(kvb_mirror_t *m, kvb_slot_t *s, unsigned holder)
{
    uint32_t     r;
    kvb_hold_t  *h;

    m->st.copies++;

    if (s->holder == holder) {
        s->copies += (s->copies < KVB_COPIES_MAX);
        return 0;
    }

    for (r = s->more; r; r = m->pool[r - 1].next) {
        h = &m->pool[r - 1];

        if (h->holder == holder) {
            h->copies += (h->copies < KVB_COPIES_MAX);
            return 0;
        }
    }

    /* a holder new to the block: not a copy */
    m->st.copies--;

    if (m->pool_free) {
        r = m->pool_free;
        m->pool_free = m->pool[r - 1].next;

    } else {
        if (m->pool_n == UINT32_MAX
            || kvb_grow((void **) &m->pool, &m->pool_cap, m->pool_n + 1,
                        sizeof(kvb_hold_t)) != 0)
        {
            return -1;
        }

        r = (uint32_t) ++m->pool_n;
    }

    h = &m->pool[r - 1];
    h->holder = (uint8_t) holder;
    h->copies = 1;
    h->next = s->more;
    s->more = r;

    return 0;
}


/*
 * One copy fewer for the holder: 1 while the block is still held, 0 when
 * its last copy went (the caller deletes the slot).
 */

static int
kvb_hold_del(kvb_mirror_t *m, kvb_slot_t *s, unsigned holder)
{
    uint32_t     r, *prev;
    kvb_hold_t  *h;

    if (s->holder == holder) {
        if (--s->copies) {
            return 1;
        }

        if (s->more == 0) {
            return 0;
        }

        /* the next holder moves into the slot */
        r = s->more;
        h = &m->pool[r - 1];
        s->holder = h->holder;
        s->copies = h->copies;
        s->more = h->next;
        h->next = m->pool_free;
        m->pool_free = r;

        return 1;
    }

    for (prev = &s->more; *prev; prev = &m->pool[*prev - 1].next) {
        r = *prev;
        h = &m->pool[r - 1];

        if (h->holder != holder) {
            continue;
        }

        if (--h->copies == 0) {
            *prev = h->next;
            h->next = m->pool_free;
            m->pool_free = r;
        }

        break;
    }

    /* that holder let go, or never held it: the slot's holder still does */
    return 1;
}


static void
kvb_hold_free_all(kvb_mirror_t *m, kvb_slot_t *s)
{
    uint32_t  r, next;

    for (r = s->more; r; r = next) {
        next = m->pool[r - 1].next;
        m->pool[r - 1].next = m->pool_free;
        m->pool_free = r;
    }

    s->more = 0;
}


/*
 * A block of the key at tier: 1 if the key is new to nginx, 0 if another
 * block has it, 2 if so but this block is faster (the key is now at tier),
 * -1: no memory.
 */

static int
kvb_key_ref(kvb_mirror_t *m, uint64_t key, unsigned tier)
{
    size_t      i;
    uint32_t   *k;
    unsigned    before;
    kvb_key_t  *kv;

    k = kvb_key_slot(m, key);

    if (k != NULL) {
        kv = &m->keyv[*k - 1];
        before = kvb_key_tier(kv);
        kv->refs++;

        if (tier < 2) {
            kv->fast[tier]++;
        }

        return kvb_key_tier(kv) != before ? 2 : 0;
    }

    if (m->nkeys == UINT32_MAX - 1
        || kvb_grow((void **) &m->keyv, &m->keyv_cap, m->nkeys + 1,
                    sizeof(kvb_key_t)) != 0)
    {
        return -1;
    }

    if (2 * (m->nkeys + 1) > m->kcap
        && kvb_key_resize(m, 65 - m->kshift) != 0)
    {
        return -1;
    }

    m->keyv[m->nkeys].key = key;
    m->keyv[m->nkeys].refs = 1;
    m->keyv[m->nkeys].fast[0] = (tier == 0);
    m->keyv[m->nkeys].fast[1] = (tier == 1);

    i = (size_t) ((key * m->secret) >> m->kshift);

    while (m->kidx[i]) {
        i = (i + 1) & (m->kcap - 1);
    }

    m->kidx[i] = (uint32_t) ++m->nkeys;

    if (m->snap_live) {
        /* told nginx by the change: on the side already sent */
        kvb_key_swap(m, m->nkeys - 1, m->snap_pos);
        m->snap_pos++;
    }

    return 1;
}


/*
 * A block of the key at tier went: 1 if no block has the key any more
 * (nginx must hear it), 2 if the key's tier changed (the block was its
 * fastest), else 0.
 */

static int
kvb_key_unref(kvb_mirror_t *m, uint64_t key, unsigned tier)
{
    size_t      pos;
    uint32_t   *k;
    unsigned    before;
    kvb_key_t  *kv;

    k = kvb_key_slot(m, key);

    if (k == NULL) {
        return 0;
    }

    pos = *k - 1;
    kv = &m->keyv[pos];
    before = kvb_key_tier(kv);

    if (tier < 2 && kv->fast[tier]) {
        kv->fast[tier]--;
    }

    if (--kv->refs) {
        return kvb_key_tier(kv) != before ? 2 : 0;
    }

    /*
     * The hole is refilled from its side of the snapshot's position: one
     * sent before it, the last key after it.
     */

    if (m->snap_live && pos < m->snap_pos) {
        kvb_key_swap(m, pos, m->snap_pos - 1);
        pos = --m->snap_pos;
    }

    kvb_key_swap(m, pos, m->nkeys - 1);
    kvb_key_drop_last(m);

    return 1;
}


static uint32_t *
kvb_key_slot(const kvb_mirror_t *m, uint64_t key)
{
    size_t  i;

    i = (size_t) ((key * m->secret) >> m->kshift);

    while (m->kidx[i]) {
        if (m->keyv[m->kidx[i] - 1].key == key) {
            return &m->kidx[i];
        }

        i = (i + 1) & (m->kcap - 1);
    }

    return NULL;
}


/* the index entry that points at the key at pos */

static uint32_t *
kvb_key_slot_of(const kvb_mirror_t *m, size_t pos)
{
    size_t  i;

    i = (size_t) ((m->keyv[pos].key * m->secret) >> m->kshift);

    while (m->kidx[i] != pos + 1) {
        i = (i + 1) & (m->kcap - 1);
    }

    return &m->kidx[i];
}


static void
kvb_key_swap(kvb_mirror_t *m, size_t a, size_t b)
{
    uint32_t   *ka, *kb;
    kvb_key_t   t;

    if (a == b) {
        return;
    }

    ka = kvb_key_slot_of(m, a);
    kb = kvb_key_slot_of(m, b);

    t = m->keyv[a];
    m->keyv[a] = m->keyv[b];
    m->keyv[b] = t;

    *ka = (uint32_t) (b + 1);
    *kb = (uint32_t) (a + 1);
}


/* the last key out of the array and of the index (backward shift) */

static void
kvb_key_drop_last(kvb_mirror_t *m)
{
    size_t  hole, i, home, mask;

    mask = m->kcap - 1;
    hole = (size_t) (kvb_key_slot_of(m, m->nkeys - 1) - m->kidx);
    i = hole;

    for ( ;; ) {
        i = (i + 1) & mask;

        if (m->kidx[i] == 0) {
            break;
        }

        home = (size_t) ((m->keyv[m->kidx[i] - 1].key * m->secret)
                         >> m->kshift);

        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->kidx[hole] = m->kidx[i];
            hole = i;
        }
    }

    m->kidx[hole] = 0;
    m->nkeys--;
}


static int
kvb_key_resize(kvb_mirror_t *m, unsigned bits)
{
    size_t     i, j, cap;
    uint32_t  *kidx;

    cap = (size_t) 1 << bits;

    kidx = calloc(cap, sizeof(uint32_t));
    if (kidx == NULL) {
        return -1;
    }

    for (i = 0; i < m->nkeys; i++) {
        j = (size_t) ((m->keyv[i].key * m->secret) >> (64 - bits));

        while (kidx[j]) {
            j = (j + 1) & (cap - 1);
        }

        kidx[j] = (uint32_t) (i + 1);
    }

    free(m->kidx);

    m->kidx = kidx;
    m->kcap = cap;
    m->kshift = 64 - bits;

    return 0;
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


/* room was made in kvb_mirror_apply(): these cannot fail */

static void
kvb_change(kvb_mirror_t *m, kva_ev_type_e type, int has_parent,
    uint64_t parent)
{
    kvb_change_t  *ev;

    ev = &m->ch.ev[m->ch.nev++];
    ev->type = type;
    ev->has_parent = has_parent ? 1 : 0;
    ev->tier = 0;
    ev->parent = parent;
    ev->off = m->ch.nhashes;
    ev->n = 0;
}


/*
 * A key to tell nginx: into the last change when it says the same (type
 * and tier), else into a new one, with the parent given (informational).
 */

static void
kvb_emit(kvb_mirror_t *m, kva_ev_type_e type, unsigned tier, uint64_t key,
    int has_parent, uint64_t parent)
{
    kvb_change_t  *last;

    last = m->ch.nev ? &m->ch.ev[m->ch.nev - 1] : NULL;

    if (last == NULL || last->type != type
        || (type == KVA_EV_STORED && last->tier != tier))
    {
        kvb_change(m, type, has_parent, parent);
        m->ch.ev[m->ch.nev - 1].tier = (type == KVA_EV_STORED) ? tier : 0;
    }

    m->ch.hashes[m->ch.nhashes++] = key;
    m->ch.ev[m->ch.nev - 1].n++;
}


/*
 * The tier of a medium: none or GPU; host memory for vLLM's "CPU" and
 * any name it begins (SGLang's HiCache under Dynamo says "CPU_TIER1");
 * any other name (vLLM's "STORAGE", a connector's own) slower still.
 */

static uint8_t
kvb_medium_tier(const char *medium, uint32_t len)
{
    if (len == 0 || (len == 3 && strncasecmp(medium, "GPU", 3) == 0)) {
        return KVA_EVENT_TIER_GPU;
    }

    if (len >= 3 && strncasecmp(medium, "CPU", 3) == 0) {
        return KVA_EVENT_TIER_CPU;
    }

    return KVA_EVENT_TIER_DISK;
}


/* a block's tier: its fastest holder's */

static unsigned
kvb_block_tier(const kvb_mirror_t *m, const kvb_slot_t *s)
{
    uint32_t  r;
    unsigned  tier, t;

    tier = m->holders[s->holder].tier;

    for (r = s->more; r && tier; r = m->pool[r - 1].next) {
        t = m->holders[m->pool[r - 1].holder].tier;
        tier = t < tier ? t : tier;
    }

    return tier;
}


static unsigned
kvb_key_tier(const kvb_key_t *k)
{
    return k->fast[0] ? KVA_EVENT_TIER_GPU
                      : k->fast[1] ? KVA_EVENT_TIER_CPU : KVA_EVENT_TIER_DISK;
}


/*
 * A block of key moved from one tier to another: when that moves the key
 * (its fastest block's tier), nginx hears a stored event at the new one.
 */

static void
kvb_key_retier(kvb_mirror_t *m, uint64_t key, unsigned from, unsigned to)
{
    uint32_t   *k;
    unsigned    before;
    kvb_key_t  *kv;

    k = kvb_key_slot(m, key);

    if (k == NULL) {
        return;
    }

    kv = &m->keyv[*k - 1];
    before = kvb_key_tier(kv);

    if (from < 2 && kv->fast[from]) {
        kv->fast[from]--;
    }

    if (to < 2) {
        kv->fast[to]++;
    }

    if (kvb_key_tier(kv) != before) {
        kvb_emit(m, KVA_EV_STORED, kvb_key_tier(kv), key, 0, 0);
        m->st.retiered++;
    }
}
