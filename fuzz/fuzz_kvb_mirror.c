/*
 * libFuzzer target: kvbridge's mirror (tools/kvbridge/kvb_mirror.c)
 * checked against what the engine holds, through the module's view.
 *
 * The input is a program for an engine that behaves as vLLM does: stores
 * (a chain's blocks, their parent held), copies of blocks already held,
 * offload tiers' stores with and without tokens, removals of copies it
 * holds, clears, in any group and tier.  Each batch is packed as vLLM
 * packs it, decoded by the real decoder, and applied to the mirror; the
 * mirror's events, and paced snapshots interleaved at any point, are
 * applied to a model of one server's key set in nginx (stored adds,
 * or sets the key's tier, removed deletes, cleared and a snapshot's first
 * part empty it).
 *
 * The reference is kept apart from the mirror's tables: per block, the
 * copies each (group, tier) holds; a block's key computed from its whole
 * chain of tokens.  Outside a snapshot nginx's set must equal the keys of
 * the blocks some dense group holds (adapters known by id alone
 * excepted), each at the tier of its fastest copy in a dense group (GPU,
 * CPU, any other medium slower), a stored key must be news (new, or at a
 * new tier) and a removed one held; inside one, nginx's set stays within
 * them, and equals them once it ends.
 * A second mirror, of 16 blocks at most, takes the same batches: full,
 * its children orphans, it must only stay within its bound.  Any
 * disagreement aborts.
 *
 *   make build/fuzz/fuzz_kvb_mirror
 *   build/fuzz/fuzz_kvb_mirror fuzz/corpus/kvb_mirror
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "kva_event.h"
#include "kva_token.h"
#include "kvb_mirror.h"
#include "kvb_vllm.h"


#define FZ_BLOCKS   128     /* block h and h ^ 64 have the same key */
#define FZ_CHAIN    4       /* blocks a chain: h - 1 is h's parent */
#define FZ_BS       4       /* tokens a block */
#define FZ_GROUPS   6
#define FZ_MEDIA    5
#define FZ_OPS      400


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


typedef struct {
    const uint8_t          *p, *end;
} fz_in_t;


static const struct {
    int                     idx;
    const char             *kind;   /* NULL: never said, dense */
    int                     dense;
} fz_groups[FZ_GROUPS] = {
    { 0, "full_attention", 1 },
    { 1, "sliding_window", 0 },
    { 2, "mla_attention", 1 },
    { 3, NULL, 1 },
    { 9, "sink_full_attention", 1 },
    { 12, "mamba", 0 },
};

static const char  *fz_media[FZ_MEDIA] = {
    "GPU", "CPU", "DISK", "REMOTE", "STORAGE"
};


/* the engine: copies of each block by (group, medium) */
static uint16_t          fz_copies[FZ_BLOCKS][FZ_GROUPS][FZ_MEDIA];
static uint8_t           fz_kind_known[FZ_GROUPS];

/* copies dense groups hold of each block: the mirror has it if any */
static unsigned          fz_dense[FZ_BLOCKS];

/* nginx's key set for the server, by key id (h & 63) */
static uint8_t           fz_set[FZ_BLOCKS / 2];
static uint8_t           fz_tier[FZ_BLOCKS / 2];  /* as nginx has it */
static size_t            fz_nset;
static int               fz_snapshot;       /* one under way */
static size_t            fz_cursor;

static uint64_t          fz_keys[FZ_BLOCKS];    /* the reference's */
static msgpack_sbuffer   fz_sb;
static msgpack_packer    fz_pk;
static kvb_mirror_t     *fz_m;
static kvb_mirror_t     *fz_small;     /* max_blocks 16 */


static unsigned fz_byte(fz_in_t *in);
static uint64_t fz_engine_hash(unsigned h);
static int fz_mode(unsigned h);
static void fz_tokens(unsigned h, uint32_t *tok);
static void fz_reference_keys(void);
static int fz_held(unsigned h);
static unsigned fz_key_tier(unsigned k);
static void fz_batch(unsigned nevents);
static void fz_str(const char *s);
static void fz_pack_stored(unsigned h, unsigned n, unsigned g, unsigned md,
    int tokens);
static void fz_pack_removed(const unsigned *h, unsigned n, unsigned g,
    unsigned md);
static void fz_apply(void);
static void fz_module(const kva_batch_t *b, int live);
static void fz_copy(unsigned h, unsigned g, unsigned md, int delta);
static unsigned fz_key_id(uint64_t key);
static void fz_check(void);
static void fz_snapshot_step(unsigned max);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned  op, h, n, g, md, i, hs[3];
    size_t    ops;
    fz_in_t   in;

    if (fz_keys[1] == 0) {
        fz_reference_keys();
        msgpack_sbuffer_init(&fz_sb);
        msgpack_packer_init(&fz_pk, &fz_sb, msgpack_sbuffer_write);
    }

    memset(fz_copies, 0, sizeof(fz_copies));
    memset(fz_dense, 0, sizeof(fz_dense));
    memset(fz_kind_known, 0, sizeof(fz_kind_known));
    memset(fz_set, 0, sizeof(fz_set));
    fz_nset = 0;
    fz_snapshot = 0;

    fz_m = kvb_mirror_create("base", 1 << 16);
    fz_small = kvb_mirror_create("base", 16);

    if (fz_m == NULL || fz_small == NULL) {
        kvb_mirror_destroy(fz_m);
        kvb_mirror_destroy(fz_small);
        return 0;
    }

    in.p = data;
    in.end = data + size;

    for (ops = 0; in.p < in.end && ops < FZ_OPS; ops++) {
        op = fz_byte(&in) % 8;
        h = fz_byte(&in) % FZ_BLOCKS;
        g = fz_byte(&in) % FZ_GROUPS;
        md = fz_byte(&in) % FZ_MEDIA;

        switch (op) {

        case 0:
        case 1:
            /* a chain's blocks from h on, its parent held */
            n = 1 + fz_byte(&in) % (FZ_CHAIN - h % FZ_CHAIN);

            if (op == 0) {
                md = 0;
            }

            if (h % FZ_CHAIN && fz_groups[g].dense && !fz_held(h - 1)) {
                break;
            }

            fz_batch(1);
            fz_pack_stored(h, n, g, md, 1);
            fz_apply();

            fz_kind_known[g] = 1;

            for (i = 0; i < n; i++) {
                fz_copy(h + i, g, md, 1);
            }

            break;

        case 2:
            /* a tier's store by hash only (vLLM's offloading connector) */
            md = 1 + md % (FZ_MEDIA - 1);

            if (!fz_groups[g].dense && !fz_kind_known[g]) {
                /* vLLM's GPU store of the group came first and said */
                break;
            }

            fz_batch(1);
            fz_pack_stored(h, 1, g, md, 0);
            fz_apply();

            if (fz_held(h) || !fz_groups[g].dense) {
                /* a block the mirror does not know: it cannot follow */
                fz_copy(h, g, md, 1);
            }

            break;

        case 3:
        case 4:
            /* up to 3 copies the engine holds in one (group, tier) */
            for (n = 0, i = 0; i < FZ_BLOCKS && n < 1 + op % 3; i++) {
                if (fz_copies[(h + i) % FZ_BLOCKS][g][md]) {
                    hs[n++] = (h + i) % FZ_BLOCKS;
                    fz_copy(hs[n - 1], g, md, -1);
                }
            }

            if (n == 0) {
                break;
            }

            fz_batch(1);
            fz_pack_removed(hs, n, g, md);
            fz_apply();
            break;

        case 5:
            if (fz_byte(&in) % 4) {
                break;
            }

            /* a store, then a clear that wipes it, in one batch */
            fz_batch(2);
            fz_pack_stored(h - h % FZ_CHAIN, 1, 0, 0, 1);
            msgpack_pack_array(&fz_pk, 1);
            fz_str("AllBlocksCleared");
            fz_apply();

            memset(fz_copies, 0, sizeof(fz_copies));
            memset(fz_dense, 0, sizeof(fz_dense));
            memset(fz_kind_known, 0, sizeof(fz_kind_known));
            break;

        default:
            fz_snapshot_step(1 + fz_byte(&in) % 8);
            break;
        }

        fz_check();
    }

    /* a snapshot at the end, whole: nginx then holds what the engine does */
    fz_snapshot_step(1 << 10);
    fz_check();

    kvb_mirror_destroy(fz_m);
    kvb_mirror_destroy(fz_small);

    return 0;
}


static unsigned
fz_byte(fz_in_t *in)
{
    return in->p < in->end ? *in->p++ : 0;
}


static uint64_t
fz_engine_hash(unsigned h)
{
    uint64_t  x;

    x = (uint64_t) (h + 1) * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;

    return x | 1;
}


/* 0: the base model, 1: adapter "tuned" by name, 2: by id alone */

static int
fz_mode(unsigned h)
{
    return (int) (((h & 63) / FZ_CHAIN) % 3);
}


static void
fz_tokens(unsigned h, uint32_t *tok)
{
    unsigned  t;

    for (t = 0; t < FZ_BS; t++) {
        tok[t] = (uint32_t) ((h & 63) * FZ_BS + t);
    }
}


/* each block's key from its chain's whole tokens, as nginx computes it */

static void
fz_reference_keys(void)
{
    unsigned  h, first, i;
    uint32_t  tok[FZ_CHAIN * FZ_BS];
    uint64_t  seed, out[FZ_CHAIN];

    for (h = 0; h < FZ_BLOCKS; h++) {
        first = h - h % FZ_CHAIN;

        for (i = first; i <= h; i++) {
            fz_tokens(i, tok + (i - first) * FZ_BS);
        }

        seed = (fz_mode(h) == 1)
               ? kva_token_seed((const uint8_t *) "tuned", 5)
               : kva_token_seed((const uint8_t *) "base", 4);

        kva_token_blocks(seed, tok, (h - first + 1) * FZ_BS, FZ_BS, NULL,
                         out, h - first + 1);
        fz_keys[h] = out[h - first];
    }
}


/* the mirror has the block: some dense group holds a copy */

static int
fz_held(unsigned h)
{
    return fz_dense[h] != 0;
}


/*
 * A key's tier: its fastest copy's among the blocks with it, in dense
 * groups; the media are GPU, CPU, then slower ones.
 */

static unsigned
fz_key_tier(unsigned k)
{
    unsigned  h, g, md, tier;

    tier = KVA_EVENT_TIER_DISK;

    for (h = k; h < FZ_BLOCKS; h += FZ_BLOCKS / 2) {
        for (g = 0; g < FZ_GROUPS; g++) {
            for (md = 0; md < FZ_MEDIA && fz_groups[g].dense; md++) {
                if (fz_copies[h][g][md] && (md < 2 ? md : 2) < tier) {
                    tier = md < 2 ? md : 2;
                }
            }
        }
    }

    return tier;
}


static void
fz_copy(unsigned h, unsigned g, unsigned md, int delta)
{
    fz_copies[h][g][md] += delta;

    if (fz_groups[g].dense) {
        fz_dense[h] += delta;
    }
}


static void
fz_str(const char *s)
{
    msgpack_pack_str(&fz_pk, strlen(s));
    msgpack_pack_str_body(&fz_pk, s, strlen(s));
}


/* {ts, events: [...]}, as vLLM's msgspec encodes an EventBatch */

static void
fz_batch(unsigned nevents)
{
    msgpack_sbuffer_clear(&fz_sb);
    msgpack_pack_map(&fz_pk, 2);
    fz_str("ts");
    msgpack_pack_double(&fz_pk, 1.0);
    fz_str("events");
    msgpack_pack_array(&fz_pk, nevents);
}


static void
fz_pack_stored(unsigned h, unsigned n, unsigned g, unsigned md, int tokens)
{
    int       mode;
    unsigned  i, t;
    uint32_t  tok[FZ_BS];

    mode = tokens ? fz_mode(h) : 0;

    msgpack_pack_map(&fz_pk, 9 + (fz_groups[g].kind && tokens)
                             + (mode != 0));
    fz_str("type"); fz_str("BlockStored");
    fz_str("block_hashes");
    msgpack_pack_array(&fz_pk, n);

    for (i = 0; i < n; i++) {
        msgpack_pack_uint64(&fz_pk, fz_engine_hash(h + i));
    }

    fz_str("parent_block_hash");

    if (tokens && h % FZ_CHAIN) {
        msgpack_pack_uint64(&fz_pk, fz_engine_hash(h - 1));
    } else {
        msgpack_pack_nil(&fz_pk);
    }

    fz_str("token_ids");
    msgpack_pack_array(&fz_pk, tokens ? n * FZ_BS : 0);

    for (i = 0; tokens && i < n; i++) {
        fz_tokens(h + i, tok);

        for (t = 0; t < FZ_BS; t++) {
            msgpack_pack_uint32(&fz_pk, tok[t]);
        }
    }

    fz_str("block_size"); msgpack_pack_int(&fz_pk, tokens ? FZ_BS : 0);

    /* newer vLLM sends the id with the name; before lora_name, the id */
    fz_str("lora_id");

    if (mode) {
        msgpack_pack_int(&fz_pk, mode == 1 ? 5 : 7);
    } else {
        msgpack_pack_nil(&fz_pk);
    }

    fz_str("medium"); fz_str(fz_media[md]);
    fz_str("lora_name");

    if (mode == 1) {
        fz_str("tuned");
    } else {
        msgpack_pack_nil(&fz_pk);
    }

    fz_str("group_idx"); msgpack_pack_int(&fz_pk, fz_groups[g].idx);

    if (fz_groups[g].kind && tokens) {
        fz_str("kv_cache_spec_kind"); fz_str(fz_groups[g].kind);
    }

    if (mode) {
        /* the adapter first among each block's extra keys */
        fz_str("extra_keys");
        msgpack_pack_array(&fz_pk, n);

        for (i = 0; i < n; i++) {
            msgpack_pack_array(&fz_pk, 1);

            if (mode == 1) {
                fz_str("tuned");
            } else {
                msgpack_pack_int(&fz_pk, 7);
            }
        }
    }
}


static void
fz_pack_removed(const unsigned *h, unsigned n, unsigned g, unsigned md)
{
    unsigned  i;

    msgpack_pack_map(&fz_pk, 4);
    fz_str("type"); fz_str("BlockRemoved");
    fz_str("block_hashes");
    msgpack_pack_array(&fz_pk, n);

    for (i = 0; i < n; i++) {
        msgpack_pack_uint64(&fz_pk, fz_engine_hash(h[i]));
    }

    fz_str("medium"); fz_str(fz_media[md]);
    fz_str("group_idx"); msgpack_pack_int(&fz_pk, fz_groups[g].idx);
}


static void
fz_apply(void)
{
    char          err[160];
    kvb_batch_t   b;
    kva_batch_t   out;
    kvb_limits_t  lim = { 1 << 16, 8, 64 };

    memset(&out, 0, sizeof(out));

    if (kvb_decode((const char *) fz_sb.data, fz_sb.size, &lim, &b, err,
                   sizeof(err))
        != KVB_OK || b.malformed || b.unknown)
    {
        /* what vLLM sends must decode whole */
        abort();
    }

    if (kvb_mirror_apply(fz_m, &b, &out) != 0) {
        abort();
    }

    fz_module(&out, 1);
    kva_batch_free(&out);

    memset(&out, 0, sizeof(out));

    if (kvb_mirror_apply(fz_small, &b, &out) != 0
        || kvb_mirror_size(fz_small) > 16
        || kvb_mirror_nkeys(fz_small) > kvb_mirror_size(fz_small))
    {
        abort();
    }

    kvb_batch_free(&b);
    kva_batch_free(&out);
}


/* nginx applies a message of the server's (live: not a snapshot's part) */

static void
fz_module(const kva_batch_t *b, int live)
{
    size_t           i, j;
    unsigned         k;
    const kva_ev_t  *ev;

    for (i = 0; i < b->nevents; i++) {
        ev = &b->events[i];

        if (ev->type == KVA_EV_CLEARED) {
            memset(fz_set, 0, sizeof(fz_set));
            fz_nset = 0;
            continue;
        }

        for (j = 0; j < ev->nhashes; j++) {
            k = fz_key_id(ev->hashes[j]);

            if (ev->type == KVA_EV_STORED) {
                if (live && !fz_snapshot && fz_set[k]
                    && fz_tier[k] == ev->tier)
                {
                    /* news that was not */
                    abort();
                }

                fz_nset += !fz_set[k];
                fz_set[k] = 1;
                fz_tier[k] = (uint8_t) ev->tier;

            } else {
                if (live && !fz_snapshot && !fz_set[k]) {
                    /* a removal of what nginx never had */
                    abort();
                }

                fz_nset -= fz_set[k];
                fz_set[k] = 0;
            }
        }
    }
}


/* a key the mirror sent is one of the keys nginx can match */

static unsigned
fz_key_id(uint64_t key)
{
    unsigned  h;

    for (h = 0; h < FZ_BLOCKS / 2; h++) {
        if (fz_keys[h] == key && fz_mode(h) != 2) {
            return h;
        }
    }

    /* an adapter known by id sent, or a key of nothing */
    abort();
}


/*
 * nginx's set against the engine's blocks: equal outside a snapshot,
 * within them during one.
 */

static void
fz_check(void)
{
    size_t    nwant, nblocks;
    unsigned  h, k;

    nwant = 0;
    nblocks = 0;

    for (h = 0; h < FZ_BLOCKS; h++) {
        nblocks += fz_held(h);
    }

    for (k = 0; k < FZ_BLOCKS / 2; k++) {
        if (fz_mode(k) == 2) {
            /* an adapter known by id: nginx cannot match it */
            continue;
        }

        if (fz_held(k) || fz_held(k + FZ_BLOCKS / 2)) {
            nwant++;

            if (!fz_snapshot && fz_set[k] && fz_tier[k] != fz_key_tier(k)) {
                /* nginx has the key at a tier it is not at */
                abort();
            }

        } else if (fz_set[k]) {
            /* nginx holds a key no block the engine holds has */
            abort();
        }
    }

    if (kvb_mirror_size(fz_m) != nblocks || kvb_mirror_nkeys(fz_m) != nwant)
    {
        abort();
    }

    if (!fz_snapshot && fz_nset != nwant) {
        /* a key the engine holds that nginx does not */
        abort();
    }
}


/* a part of a paced snapshot, the first one starting it */

static void
fz_snapshot_step(unsigned max)
{
    size_t       n, i;
    uint8_t      tiers[1 << 10];
    uint64_t     part[1 << 10];
    kva_ev_t     ev;
    kva_batch_t  b;

    if (!fz_snapshot) {
        /* a snapshot's first part: nginx forgets what the server said */
        fz_cursor = 0;
        fz_snapshot = 1;
        memset(fz_set, 0, sizeof(fz_set));
        fz_nset = 0;
    }

    n = kvb_mirror_keys_tiered(fz_m, &fz_cursor, part, tiers, max);

    memset(&b, 0, sizeof(b));
    memset(&ev, 0, sizeof(ev));
    ev.type = KVA_EV_STORED;
    ev.hashes = part;
    ev.nhashes = n;
    b.events = &ev;
    b.nevents = 1;
    fz_module(&b, 0);

    /* as the bridge sends them: a stored event a tier */
    for (i = 0; i < n; i++) {
        fz_tier[fz_key_id(part[i])] = tiers[i];
    }

    if (n < max) {
        fz_snapshot = 0;
    }
}
