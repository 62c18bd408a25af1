/*
 * kvbridge's mirror (tools/kvbridge/kvb_mirror.c) and the token key space
 * (src/core/kva_token.c): engine events in, the module's events out, with
 * the keys the module computes from the same token ids.  Batches are
 * packed with msgpack-c and go through the real decoder.
 */

#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "tap.h"
#include "kva_hash.h"
#include "kva_token.h"
#include "kvb_mirror.h"
#include "kva_rand.h"


#define BS  16      /* tokens a block */


static const kvb_limits_t  lim = { 1 << 24, 1 << 16, 1 << 20 };

static msgpack_sbuffer  sb;
static msgpack_packer   pk;
static uint32_t         ids[64 * BS];


static void
str(const char *s)
{
    msgpack_pack_str(&pk, strlen(s));
    msgpack_pack_str_body(&pk, s, strlen(s));
}


/* a batch of n events, by name as vLLM 0.26 sends it: pack them next */

static void
batch_start_n(unsigned n)
{
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_map(&pk, 2);
    str("ts");
    msgpack_pack_double(&pk, 1.0);
    str("events");
    msgpack_pack_array(&pk, n);
}


static void
batch_start(void)
{
    batch_start_n(1);
}


typedef struct {
    const uint64_t  *engine;
    unsigned         n;
    int              has_parent;
    uint64_t         parent;
    unsigned         first_token;   /* index into ids */
    const char      *medium;
    const char      *lora;
    int              group;         /* -1: absent */
    const char      *kind;
    const char      *extra0;        /* the first block's mm identifier */
    const uint32_t  *tokens;        /* in place of ids + first_token */
    int64_t          lora_id;       /* 0: absent */
    int              untokened;     /* a tier's: token_ids [], size 0 */
} stored_t;


static void
pack_stored(const stored_t *s)
{
    unsigned         i, fields, ntok;
    const uint32_t  *tok;

    fields = 6 + (s->lora != NULL) + (s->group >= 0) + (s->kind != NULL)
             + (s->lora != NULL || s->extra0 != NULL || s->lora_id)
             + (s->lora_id != 0);

    msgpack_pack_map(&pk, fields);
    str("type"); str("BlockStored");
    str("block_hashes");
    msgpack_pack_array(&pk, s->n);

    for (i = 0; i < s->n; i++) {
        msgpack_pack_uint64(&pk, s->engine[i]);
    }

    str("parent_block_hash");

    if (s->has_parent) {
        msgpack_pack_uint64(&pk, s->parent);
    } else {
        msgpack_pack_nil(&pk);
    }

    tok = s->tokens ? s->tokens : ids + s->first_token;
    ntok = s->untokened ? 0 : s->n * BS;

    str("token_ids");
    msgpack_pack_array(&pk, ntok);

    for (i = 0; i < ntok; i++) {
        msgpack_pack_uint32(&pk, tok[i]);
    }

    str("block_size"); msgpack_pack_int(&pk, s->untokened ? 0 : BS);
    str("medium"); str(s->medium ? s->medium : "GPU");

    if (s->lora) {
        str("lora_name"); str(s->lora);
    }

    if (s->lora_id) {
        str("lora_id"); msgpack_pack_int64(&pk, s->lora_id);
    }

    if (s->group >= 0) {
        str("group_idx"); msgpack_pack_int(&pk, s->group);
    }

    if (s->kind) {
        str("kv_cache_spec_kind"); str(s->kind);
    }

    if (s->lora || s->extra0 || s->lora_id) {
        /*
         * vLLM: (lora_name, mm keys...) a block, None when empty; before
         * lora_name, the adapter's id first
         */
        str("extra_keys");
        msgpack_pack_array(&pk, s->n);

        for (i = 0; i < s->n; i++) {
            if (i == 0 && s->extra0) {
                msgpack_pack_array(&pk, (s->lora || s->lora_id) ? 2 : 1);
                if (s->lora) {
                    str(s->lora);
                } else if (s->lora_id) {
                    msgpack_pack_int64(&pk, s->lora_id);
                }

                msgpack_pack_array(&pk, 2);
                str(s->extra0);
                msgpack_pack_int(&pk, 0);

            } else if (s->lora) {
                msgpack_pack_array(&pk, 1);
                str(s->lora);

            } else if (s->lora_id) {
                msgpack_pack_array(&pk, 1);
                msgpack_pack_int64(&pk, s->lora_id);

            } else {
                msgpack_pack_nil(&pk);
            }
        }
    }
}


static void
pack_removed(const uint64_t *engine, unsigned n, const char *medium,
    int group)
{
    unsigned  i;

    msgpack_pack_map(&pk, 3 + (group >= 0));
    str("type"); str("BlockRemoved");
    str("block_hashes");
    msgpack_pack_array(&pk, n);

    for (i = 0; i < n; i++) {
        msgpack_pack_uint64(&pk, engine[i]);
    }

    str("medium"); str(medium);

    if (group >= 0) {
        str("group_idx"); msgpack_pack_int(&pk, group);
    }
}


/* decodes what was packed, applies it, out receives the module's events */

static int
apply(kvb_mirror_t *m, kva_batch_t *out)
{
    int          rc;
    char         err[128];
    kvb_batch_t  b;

    memset(out, 0, sizeof(kva_batch_t));

    if (kvb_decode(sb.data, sb.size, &lim, &b, err, sizeof(err)) != KVB_OK
        || b.malformed || b.unknown)
    {
        printf("# decode: %s\n", err);
        kvb_batch_free(&b);
        return -1;
    }

    rc = kvb_mirror_apply(m, &b, out);
    kvb_batch_free(&b);

    return rc;
}


static uint64_t
model_seed(const char *name)
{
    return kva_token_seed((const uint8_t *) name, strlen(name));
}


/* block j's own tokens: no two blocks share a key */

static void
block_tokens(size_t j, uint32_t *tok)
{
    unsigned  t;

    for (t = 0; t < BS; t++) {
        tok[t] = (uint32_t) (j * BS + t);
    }
}


/* the keys of one stored event out, or 0 */

static uint64_t
stored_key(const kva_batch_t *out)
{
    return (out->nevents == 1 && out->events[0].type == KVA_EV_STORED
            && out->events[0].nhashes == 1)
           ? out->events[0].hashes[0] : 0;
}


static int
removed_one(const kva_batch_t *out, uint64_t key)
{
    return out->nevents == 1 && out->events[0].type == KVA_EV_REMOVED
           && out->events[0].nhashes == 1 && out->events[0].hashes[0] == key;
}


static void
test_token_key_is_text_chain(void)
{
    size_t    i, n;
    uint8_t   bytes[4 * 64 * 4];
    uint64_t  a[4], b[4], seed;

    for (i = 0; i < 64 * 4; i++) {
        bytes[4 * i] = (uint8_t) ids[i];
        bytes[4 * i + 1] = (uint8_t) (ids[i] >> 8);
        bytes[4 * i + 2] = (uint8_t) (ids[i] >> 16);
        bytes[4 * i + 3] = (uint8_t) (ids[i] >> 24);
    }

    seed = model_seed("m");

    /* 16 tokens: one piece; 64 tokens: two pieces of 128 bytes */

    n = kva_token_blocks(seed, ids, 4 * 16 + 5, 16, NULL, a, 4);
    ok(n == 4 && kva_hash_blocks(seed, bytes, 4 * 4 * 16 + 20, 64, b, 4) == 4
       && memcmp(a, b, sizeof(a)) == 0,
       "a 16-token block keys as text's chain over its 64 LE bytes");

    n = kva_token_blocks(seed, ids, 4 * 64, 64, NULL, a, 4);
    ok(n == 4 && kva_hash_blocks(seed, bytes, 4 * 4 * 64, 256, b, 4) == 4
       && memcmp(a, b, sizeof(a)) == 0, "64-token blocks, pieces chained");

    ok(kva_token_blocks(seed, ids, 15, 16, NULL, a, 4) == 0,
       "a partial block has no key");
    ok(seed != kva_hash_seed(KVA_KEYSPACE_TEXT, (const uint8_t *) "m", 1),
       "the token key space does not share text's seeds");
}


static void
test_chain_and_removal(void)
{
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       want[3];
    uint64_t       e[3] = { 1001, 1002, 1003 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    kva_token_blocks(model_seed("llama"), ids, 3 * BS, BS, NULL, want, 3);

    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 2;
    s.group = -1;

    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].type == KVA_EV_STORED
       && out.events[0].nhashes == 2 && !out.events[0].has_parent
       && out.events[0].hashes[0] == want[0]
       && out.events[0].hashes[1] == want[1],
       "stored without parent: the model's keys of the token ids");
    kva_batch_free(&out);

    /* the child names its parent by the engine's hash only */
    s.engine = e + 2;
    s.n = 1;
    s.has_parent = 1;
    s.parent = 1002;
    s.first_token = 2 * BS;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].has_parent && out.events[0].parent == want[1]
       && out.events[0].hashes[0] == want[2],
       "a child chains from its parent's key");
    kva_batch_free(&out);

    s.parent = 999;
    s.engine = (uint64_t[]) { 2001 };
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0
       && kvb_mirror_stats(m)->orphans == 1 && kvb_mirror_size(m) == 3,
       "an unknown parent: not keyed, counted as an orphan");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "GPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].type == KVA_EV_REMOVED
       && out.events[0].nhashes == 1 && out.events[0].hashes[0] == want[0]
       && kvb_mirror_size(m) == 2, "removed: the module hears our key");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


static void
test_tiers_and_groups(void)
{
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[1] = { 77 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 1;
    s.group = -1;

    batch_start();
    pack_stored(&s);
    apply(m, &out);
    kva_batch_free(&out);

    s.medium = "CPU";
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0, "offloaded copy: no news");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "GPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].type == KVA_EV_STORED
       && out.events[0].tier == KVA_EVENT_TIER_CPU && kvb_mirror_size(m) == 1,
       "evicted from GPU, still in CPU memory: held, at the CPU tier");
    kva_batch_free(&out);

    /* a sliding-window group of a hybrid model, same engine hash */
    s.medium = NULL;
    s.group = 1;
    s.kind = "sliding_window";
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0
       && kvb_mirror_stats(m)->skipped_group == 1,
       "a sliding-window group's store is skipped");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "CPU", 1);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 1,
       "its removal does not remove the full-attention block");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "CPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].type == KVA_EV_REMOVED && kvb_mirror_size(m) == 0,
       "the last tier lets go: removed");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


static void
test_lora_and_extra(void)
{
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       plain[2], ka[2], kb[2], want[2];
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.n = 2;
    s.group = -1;

    s.engine = (uint64_t[]) { 1, 2 };
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    memcpy(plain, out.events[0].hashes, sizeof(plain));
    kva_batch_free(&out);

    s.engine = (uint64_t[]) { 3, 4 };
    s.lora = "adapter-a";
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    memcpy(ka, out.events[0].hashes, sizeof(ka));
    kva_batch_free(&out);

    s.engine = (uint64_t[]) { 5, 6 };
    s.lora = "adapter-b";
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    memcpy(kb, out.events[0].hashes, sizeof(kb));
    kva_batch_free(&out);

    kva_token_blocks(model_seed("adapter-a"), ids, 2 * BS, BS, NULL, want, 2);
    ok(memcmp(ka, want, sizeof(ka)) == 0,
       "an adapter's blocks: seeded by its name, its name out of the keys");
    ok(ka[0] != plain[0] && kb[0] != plain[0] && ka[0] != kb[0]
       && ka[1] != kb[1], "same prompt, two adapters, base: three keys");

    s.engine = (uint64_t[]) { 7, 8 };
    s.lora = NULL;
    s.extra0 = "image-sha256-0f3a";
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    ok(out.nevents == 1 && out.events[0].hashes[0] != plain[0]
       && out.events[0].hashes[1] != plain[1],
       "an image in the first block: it and its children never match text");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


static void
test_clear_and_bounds(void)
{
    unsigned       i;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[8];
    stored_t       s;

    m = kvb_mirror_create("llama", 4);
    memset(&s, 0, sizeof(s));

    for (i = 0; i < 8; i++) {
        e[i] = 500 + i;
    }

    s.engine = e;
    s.n = 6;
    s.group = -1;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.events[0].nhashes == 4
       && kvb_mirror_size(m) == 4 && kvb_mirror_stats(m)->full == 2,
       "max_blocks 4: 4 kept, 2 counted as full");
    kva_batch_free(&out);

    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_array(&pk, 2);
    pack_removed(e, 1, "GPU", -1);
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].type == KVA_EV_CLEARED && kvb_mirror_size(m) == 0,
       "cleared: one cleared event, what came before it dropped");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/* many stores and removals in random order keep every lookup right */

static void
test_churn(void)
{
    size_t         i, j, n, cursor, seen, left;
    uint32_t       tok[BS];
    uint64_t       state, keys[64];
    kvb_mirror_t  *m;
    kva_batch_t    out;
    uint64_t      *e;
    uint8_t       *held;
    stored_t       s;
    int            wrong;

    n = 20000;
    e = malloc(n * sizeof(uint64_t));
    held = calloc(n, 1);
    m = kvb_mirror_create("m", n);
    state = 42;
    wrong = 0;
    left = 0;

    for (i = 0; i < n; i++) {
        /* engine hashes that share their high bits: one run of slots */
        e[i] = (kva_rand_next(&state) & 0xffff) | ((uint64_t) i << 16);
    }

    memset(&s, 0, sizeof(s));
    s.n = 1;
    s.group = -1;

    for (i = 0; i < 3 * n; i++) {
        j = kva_rand_below(&state, n);
        batch_start();

        if (held[j]) {
            pack_removed(&e[j], 1, "GPU", -1);
        } else {
            /* a block of its own tokens: a key of its own */
            block_tokens(j, tok);
            s.engine = &e[j];
            s.tokens = tok;
            pack_stored(&s);
        }

        if (apply(m, &out) != 0 || out.nevents != 1) {
            wrong++;
        }

        left += held[j] ? -1 : 1;
        held[j] ^= 1;
        kva_batch_free(&out);
    }

    cursor = 0;
    seen = 0;

    while ((j = kvb_mirror_keys(m, &cursor, keys, 64)) > 0) {
        seen += j;
    }

    ok(wrong == 0, "60,000 stores and removals: each one news exactly once");
    ok(kvb_mirror_size(m) == left && seen == left,
       "the mirror holds what the engine holds (%zu)", left);

    kvb_mirror_destroy(m);
    free(e);
    free(held);
}


/*
 * Issue 18, 9: an adapter vLLM names by lora_id alone (no lora_name,
 * vLLM up to about 0.10) is not the base model: nginx knows adapters by
 * the name requests carry, so its blocks are held, not published.
 */

static void
test_lora_id_only(void)
{
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[3] = { 31, 32, 33 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 2;
    s.group = -1;
    s.lora_id = 3;

    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0
       && kvb_mirror_stats(m)->lora_unnamed == 2 && kvb_mirror_size(m) == 2,
       "an adapter known by id only: nothing published as the base model, "
       "its blocks held and counted");
    kva_batch_free(&out);

    /* its child, named by the parent's hash */
    s.engine = e + 2;
    s.n = 1;
    s.has_parent = 1;
    s.parent = 32;
    s.first_token = 2 * BS;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0
       && kvb_mirror_stats(m)->orphans == 0
       && kvb_mirror_stats(m)->lora_unnamed == 3,
       "its child is understood (no orphan), not published");
    kva_batch_free(&out);

    /* the base model's same prompt: its own keys */
    s.engine = (uint64_t[]) { 41, 42 };
    s.n = 2;
    s.has_parent = 0;
    s.first_token = 0;
    s.lora_id = 0;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 1
       && out.events[0].nhashes == 2,
       "the base model's blocks of the same tokens are published");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 3, "GPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 2,
       "the adapter's removals: nothing to tell, the base model's kept");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/*
 * Issue 18, 9: two engine blocks with one key (the engine hashed what the
 * events do not carry): the key goes when neither has it.
 */

static void
test_shared_key(void)
{
    uint64_t       key;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[2] = { 51, 52 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.n = 1;
    s.group = -1;

    s.engine = &e[0];
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    key = stored_key(&out);
    kva_batch_free(&out);

    s.engine = &e[1];
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0 && key != 0
       && kvb_mirror_stats(m)->shared_keys == 1,
       "a second engine block with the same key: no news");
    kva_batch_free(&out);

    batch_start();
    pack_removed(&e[0], 1, "GPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_nkeys(m) == 1,
       "one of them removed: the key is still held, nginx hears nothing");
    kva_batch_free(&out);

    batch_start();
    pack_removed(&e[1], 1, "GPU", -1);
    ok(apply(m, &out) == 0 && removed_one(&out, key)
       && kvb_mirror_nkeys(m) == 0, "the other removed: the key goes");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/*
 * Issue 18, 12: holders are (group, medium) by their whole values:
 * groups past 7 and tiers past GPU and CPU are told apart.
 */

static void
test_holders_apart(void)
{
    unsigned       i;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[1] = { 61 }, key;
    stored_t       s;

    static const struct {
        int          g1, g2;
        const char  *m1, *m2;
        const char  *what;
    } pairs[] = {
        { 8, 9, "GPU", "GPU", "groups 8 and 9" },
        { 0, 0, "DISK", "REMOTE", "tiers DISK and REMOTE" },
        { 0, 0, "CPU", "STORAGE", "tiers CPU and STORAGE" },
        { 1, 12, "STORAGE", "STORAGE", "groups 1 and 12 in STORAGE" },
    };

    for (i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        m = kvb_mirror_create("llama", 1000);
        memset(&s, 0, sizeof(s));
        s.engine = e;
        s.n = 1;

        s.group = pairs[i].g1;
        s.medium = pairs[i].m1;
        batch_start();
        pack_stored(&s);
        apply(m, &out);
        key = stored_key(&out);
        kva_batch_free(&out);

        s.group = pairs[i].g2;
        s.medium = pairs[i].m2;
        batch_start();
        pack_stored(&s);
        apply(m, &out);
        kva_batch_free(&out);

        batch_start();
        pack_removed(e, 1, pairs[i].m2, pairs[i].g2);
        ok(apply(m, &out) == 0 && out.nevents == 0
           && kvb_mirror_size(m) == 1,
           "%s: one lets go, the other still holds it", pairs[i].what);
        kva_batch_free(&out);

        batch_start();
        pack_removed(e, 1, pairs[i].m1, pairs[i].g1);
        ok(apply(m, &out) == 0 && removed_one(&out, key)
           && kvb_mirror_size(m) == 0, "%s: both let go, removed",
           pairs[i].what);
        kva_batch_free(&out);

        kvb_mirror_destroy(m);
    }
}


/*
 * Issue 18, 13: MLA and attention-sink groups are dense; what is skipped
 * is counted by kind.
 */

static void
test_dense_kinds(void)
{
    unsigned       i;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[1];
    stored_t       s;
    const kvb_mirror_stats_t  *st;

    static const char  *dense[] = {
        "full_attention", "mla_attention", "sink_full_attention"
    };
    static const char  *sparse[] = {
        "sliding_window", "sliding_window_mla", "chunked_local_attention",
        "mamba", "cross_attention", "encoder_only_attention"
    };

    for (i = 0; i < 3; i++) {
        m = kvb_mirror_create("deepseek", 1000);
        memset(&s, 0, sizeof(s));
        e[0] = 70 + i;
        s.engine = e;
        s.n = 1;
        s.group = 0;
        s.kind = dense[i];

        batch_start();
        pack_stored(&s);
        ok(apply(m, &out) == 0 && stored_key(&out) != 0
           && kvb_mirror_stats(m)->skipped_group == 0,
           "%s: a dense group, its blocks published", dense[i]);
        kva_batch_free(&out);
        kvb_mirror_destroy(m);
    }

    m = kvb_mirror_create("hybrid", 1000);

    for (i = 0; i < 6; i++) {
        memset(&s, 0, sizeof(s));
        e[0] = 80 + i;
        s.engine = e;
        s.n = 1;
        s.group = 1 + i;
        s.kind = sparse[i];

        batch_start();
        pack_stored(&s);
        apply(m, &out);
        ok(out.nevents == 0, "%s: skipped", sparse[i]);
        kva_batch_free(&out);
    }

    st = kvb_mirror_stats(m);
    ok(st->skipped_group == 6 && st->skipped_sliding == 3
       && st->skipped_mamba == 1 && st->skipped_kind == 2,
       "skipped, by kind: 3 sliding or chunked, 1 mamba, 2 other");

    kvb_mirror_destroy(m);
}


/* one stored event at tier holding exactly keys[0 .. n) */
static int
stored_at(const kva_batch_t *out, unsigned tier, const uint64_t *keys,
    unsigned n)
{
    return out->nevents == 1 && out->events[0].type == KVA_EV_STORED
           && out->events[0].tier == tier && out->events[0].nhashes == n
           && memcmp(out->events[0].hashes, keys, n * sizeof(uint64_t)) == 0;
}


/*
 * Issue 21: tiers.  A key goes to nginx at its fastest copy's tier, again
 * whenever that changes: a GPU copy gone while a CPU one stays moves it
 * to CPU, a GPU store lifts it, any other medium is slower still, and it
 * is removed with its last copy in any tier.  A snapshot says the tiers.
 */

static void
test_tier_moves(void)
{
    int            good;
    size_t         cursor, n, i;
    uint8_t        tiers[8];
    uint64_t       keys[3], snap[8];
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[3] = { 301, 302, 303 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 3;
    s.group = -1;

    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 1 && out.events[0].nhashes == 3
       && out.events[0].tier == KVA_EVENT_TIER_GPU, "stored on GPU");
    memcpy(keys, out.events[0].hashes, sizeof(keys));
    kva_batch_free(&out);

    s.medium = "CPU_TIER1";
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0,
       "offloaded to CPU_TIER1 (host memory): no news, GPU is faster");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 3, "GPU", -1);
    ok(apply(m, &out) == 0 && stored_at(&out, KVA_EVENT_TIER_CPU, keys, 3)
       && kvb_mirror_size(m) == 3,
       "the GPU copies go: one stored event at the CPU tier, not removed");
    kva_batch_free(&out);

    s.medium = NULL;
    s.n = 2;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && stored_at(&out, KVA_EVENT_TIER_GPU, keys, 2),
       "stored on GPU again: the two lifted");
    kva_batch_free(&out);

    s.medium = "LocalDisk";
    s.n = 3;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0,
       "a third tier below: no news");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 3, "CPU_TIER1", -1);
    ok(apply(m, &out) == 0
       && stored_at(&out, KVA_EVENT_TIER_DISK, keys + 2, 1),
       "the CPU copies go: the block not on GPU moves to disk");
    kva_batch_free(&out);

    cursor = 0;
    good = 1;
    n = kvb_mirror_keys_tiered(m, &cursor, snap, tiers, 8);
    for (i = 0; i < n; i++) {
        good &= tiers[i] == (snap[i] == keys[2] ? KVA_EVENT_TIER_DISK
                                                : KVA_EVENT_TIER_GPU);
    }

    ok(n == 3 && good, "a snapshot says each key's tier");

    batch_start();
    pack_removed(e + 2, 1, "LocalDisk", -1);
    ok(apply(m, &out) == 0 && removed_one(&out, keys[2])
       && kvb_mirror_size(m) == 2, "its last copy goes: removed");
    kva_batch_free(&out);

    /* a GPU removal and a lift in one batch: in order, one event each */
    batch_start_n(2);
    pack_removed(e, 1, "GPU", -1);
    s.medium = NULL;
    s.n = 1;
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 2
       && out.events[0].tier == KVA_EVENT_TIER_DISK
       && out.events[1].tier == KVA_EVENT_TIER_GPU
       && out.events[1].hashes[0] == keys[0]
       && kvb_mirror_stats(m)->retiered == 8,
       "down then up in one batch: two events, in order");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/*
 * Issue 18, 13: an offload tier's BlockStored without tokens (vLLM's
 * offloading connector without self_describing_kv_events) names a block
 * by the engine's hash: a holder for a block the mirror knows, counted and
 * skipped for one it does not, never keyed by an empty token list.
 */

static void
test_offload_untokened(void)
{
    uint64_t       key;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       e[1] = { 91 }, unknown[1] = { 92 };
    stored_t       s;

    m = kvb_mirror_create("llama", 1000);
    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 1;
    s.group = 0;
    s.kind = "full_attention";

    batch_start();
    pack_stored(&s);
    apply(m, &out);
    key = stored_key(&out);
    kva_batch_free(&out);

    memset(&s, 0, sizeof(s));
    s.engine = e;
    s.n = 1;
    s.group = 0;
    s.medium = "CPU";
    s.untokened = 1;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 1,
       "a CPU copy named by hash only: no news, a holder more");
    kva_batch_free(&out);

    s.engine = unknown;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 1
       && kvb_mirror_stats(m)->untokened == 1,
       "a block the mirror does not know, by hash only: counted, not keyed");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "GPU", 0);
    ok(apply(m, &out) == 0 && stored_key(&out) == key
       && out.events[0].tier == KVA_EVENT_TIER_CPU && kvb_mirror_size(m) == 1,
       "evicted from the GPU: the CPU copy holds it, at its tier");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e, 1, "CPU", 0);
    ok(apply(m, &out) == 0 && removed_one(&out, key),
       "the CPU copy evicted: removed");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/*
 * Issue 18, 14: vLLM does not merge a block computed twice and sends one
 * BlockRemoved a copy: the block goes with its last copy.
 */

static void
test_copies(void)
{
    kva_batch_t    out;
    kvb_mirror_t  *m;
    uint64_t       want[3];
    uint64_t       e[3] = { 101, 102, 103 };
    stored_t       s;

    m = kvb_mirror_create("llama", 8);
    kva_token_blocks(model_seed("llama"), ids, 3 * BS, BS, NULL, want, 3);
    memset(&s, 0, sizeof(s));
    s.group = -1;

    /* a prompt of 2 blocks, its third filled by decoding, twice */
    s.engine = e;
    s.n = 2;
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    kva_batch_free(&out);

    s.engine = e + 2;
    s.n = 1;
    s.has_parent = 1;
    s.parent = 102;
    s.first_token = 2 * BS;
    batch_start();
    pack_stored(&s);
    apply(m, &out);
    kva_batch_free(&out);

    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0
       && kvb_mirror_stats(m)->copies == 1, "block 2's second copy: no news");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e + 2, 1, "GPU", -1);
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 3,
       "the older copy evicted: block 2 still held, nothing removed");
    kva_batch_free(&out);

    batch_start();
    pack_removed(e + 2, 1, "GPU", -1);
    ok(apply(m, &out) == 0 && removed_one(&out, want[2]),
       "the last copy evicted: removed");
    kva_batch_free(&out);

    kvb_mirror_destroy(m);
}


/* n blocks of their own keys stored, e[i] -> keys[i] */

static kvb_mirror_t *
mirror_of(size_t n, uint64_t *e, uint64_t *keys)
{
    size_t         i;
    uint32_t       tok[BS];
    uint64_t       state;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    stored_t       s;

    m = kvb_mirror_create("m", 1 << 20);
    memset(&s, 0, sizeof(s));
    s.n = 1;
    s.group = -1;

    state = 99;

    for (i = 0; i < n; i++) {
        /* uniform, as an engine's are: clusters form */
        e[i] = kva_rand_next(&state);
        block_tokens(i, tok);
        s.engine = &e[i];
        s.tokens = tok;
        batch_start();
        pack_stored(&s);
        apply(m, &out);
        keys[i] = stored_key(&out);
        kva_batch_free(&out);
    }

    return m;
}


static size_t
key_index(const uint64_t *keys, size_t n, uint64_t key)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        if (keys[i] == key) {
            return i;
        }
    }

    return n;
}


/*
 * Issue 18, 11: a paced snapshot, one key a part, each block removed
 * once its key is sent.  Each removal used to pull an unsent neighbour
 * back behind the snapshot's cursor (backward-shift deletion): on a table
 * half full, some of 600 were lost every time.
 */

static void
test_snapshot_removals(void)
{
    size_t         n, cursor, got, twice, k;
    uint8_t        seen[600];
    uint64_t       e[600], keys[600], key;
    kva_batch_t    out;
    kvb_mirror_t  *m;

    n = 600;
    m = mirror_of(n, e, keys);
    memset(seen, 0, sizeof(seen));
    cursor = 0;
    got = 0;
    twice = 0;

    while (kvb_mirror_keys(m, &cursor, &key, 1) == 1) {
        k = key_index(keys, n, key);

        if (k == n || seen[k]) {
            twice++;
            continue;
        }

        seen[k] = 1;
        got++;

        batch_start();
        pack_removed(&e[k], 1, "GPU", -1);
        apply(m, &out);
        kva_batch_free(&out);
    }

    ok(got == n && twice == 0 && kvb_mirror_size(m) == 0,
       "a paced snapshot with each key's block removed once sent: %zu of "
       "%zu keys sent, %zu twice or unknown", got, n, twice);

    kvb_mirror_destroy(m);
}


/*
 * Issue 18, 11: under churn (stores, removals, the tables growing), every
 * key held from a snapshot's first part to its last is in it once, and
 * every key it sends was held when sent.
 */

static void
test_snapshot_churn(void)
{
    size_t         i, j, n, round, cursor, got, max, lost, wrong, dup;
    uint32_t       tok[BS];
    uint64_t       state, *e, *keys, part[16];
    uint8_t       *held, *throughout, *sent;
    kva_batch_t    out;
    kvb_mirror_t  *m;
    stored_t       s;

    n = 6000;
    e = calloc(n, sizeof(uint64_t));
    keys = calloc(n, sizeof(uint64_t));
    held = calloc(n, 1);
    throughout = calloc(n, 1);
    sent = calloc(n, 1);
    m = kvb_mirror_create("m", n);
    state = 1811;
    lost = 0;
    wrong = 0;
    dup = 0;

    memset(&s, 0, sizeof(s));
    s.n = 1;
    s.group = -1;

    for (i = 0; i < n; i++) {
        e[i] = kva_rand_next(&state);
        block_tokens(i, tok);
        kva_token_blocks(model_seed("m"), tok, BS, BS, NULL, &keys[i], 1);
    }

    for (round = 0; round < 40; round++) {
        cursor = 0;
        got = 0;
        max = 0;

        for ( ;; ) {
            for (j = 0; j < got; j++) {
                i = key_index(keys, n, part[j]);

                if (i == n || !held[i]) {
                    wrong++;
                } else if (sent[i]++) {
                    dup++;
                }
            }

            if (got < max) {
                break;
            }

            /*
             * a few engine batches between parts; before the first, the
             * mirror filled (and emptied, early rounds) far more
             */
            j = (max == 0) ? 2000 + kva_rand_below(&state, 2000)
                           : kva_rand_below(&state, 96);

            for ( ; j > 0; j--) {
                i = kva_rand_below(&state, round < 10 ? n / 4 : n);

                if (got && kva_rand_below(&state, 2)) {
                    /* often one just sent: it sits next to the cursor */
                    i = key_index(keys, n,
                                  part[kva_rand_below(&state, got)]);
                }

                batch_start();

                if (held[i]) {
                    pack_removed(&e[i], 1, "GPU", -1);
                    throughout[i] = 0;

                } else {
                    block_tokens(i, tok);
                    s.engine = &e[i];
                    s.tokens = tok;
                    pack_stored(&s);
                }

                held[i] ^= 1;

                if (apply(m, &out) != 0) {
                    wrong++;
                }

                kva_batch_free(&out);
            }

            if (max == 0) {
                /* the snapshot starts: what is held now must be in it */
                for (i = 0; i < n; i++) {
                    throughout[i] = held[i];
                    sent[i] = 0;
                }
            }

            max = 1 + kva_rand_below(&state, 16);
            got = kvb_mirror_keys(m, &cursor, part, max);
        }

        for (i = 0; i < n; i++) {
            lost += throughout[i] && !sent[i];
        }
    }

    ok(lost == 0 && wrong == 0 && dup == 0,
       "40 paced snapshots under churn: %zu keys held throughout lost, %zu "
       "sent not held, %zu sent twice", lost, wrong, dup);

    kvb_mirror_destroy(m);
    free(e);
    free(keys);
    free(held);
    free(throughout);
    free(sent);
}


int
main(void)
{
    size_t    i;
    uint64_t  state;

    state = 7;

    for (i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        ids[i] = (uint32_t) kva_rand_below(&state, 152064);
    }

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);

    test_token_key_is_text_chain();
    test_chain_and_removal();
    test_tiers_and_groups();
    test_tier_moves();
    test_lora_and_extra();
    test_clear_and_bounds();
    test_churn();
    test_lora_id_only();
    test_shared_key();
    test_holders_apart();
    test_dense_kinds();
    test_offload_untokened();
    test_copies();
    test_snapshot_removals();
    test_snapshot_churn();

    msgpack_sbuffer_destroy(&sb);

    return done_testing();
}
