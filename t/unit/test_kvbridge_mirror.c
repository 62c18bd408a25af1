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


/* a batch of one event, by name as vLLM 0.26 sends it */

static void
batch_start(void)
{
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_map(&pk, 2);
    str("ts");
    msgpack_pack_double(&pk, 1.0);
    str("events");
    msgpack_pack_array(&pk, 1);
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
} stored_t;


static void
pack_stored(const stored_t *s)
{
    unsigned  i, fields;

    fields = 6 + (s->lora != NULL) + (s->group >= 0) + (s->kind != NULL)
             + (s->lora != NULL || s->extra0 != NULL);

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

    str("token_ids");
    msgpack_pack_array(&pk, s->n * BS);

    for (i = 0; i < s->n * BS; i++) {
        msgpack_pack_uint32(&pk, ids[s->first_token + i]);
    }

    str("block_size"); msgpack_pack_int(&pk, BS);
    str("medium"); str(s->medium ? s->medium : "GPU");

    if (s->lora) {
        str("lora_name"); str(s->lora);
    }

    if (s->group >= 0) {
        str("group_idx"); msgpack_pack_int(&pk, s->group);
    }

    if (s->kind) {
        str("kv_cache_spec_kind"); str(s->kind);
    }

    if (s->lora || s->extra0) {
        /* vLLM: (lora_name, mm keys...) a block, None when empty */
        str("extra_keys");
        msgpack_pack_array(&pk, s->n);

        for (i = 0; i < s->n; i++) {
            if (i == 0 && s->extra0) {
                msgpack_pack_array(&pk, s->lora ? 2 : 1);
                if (s->lora) {
                    str(s->lora);
                }

                msgpack_pack_array(&pk, 2);
                str(s->extra0);
                msgpack_pack_int(&pk, 0);

            } else if (s->lora) {
                msgpack_pack_array(&pk, 1);
                str(s->lora);

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

    /* again: the engine re-stores what it holds, the module hears nothing */
    s.engine = e;
    s.n = 2;
    s.has_parent = 0;
    s.first_token = 0;
    batch_start();
    pack_stored(&s);
    ok(apply(m, &out) == 0 && out.nevents == 0, "a block held is not news");
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
    ok(apply(m, &out) == 0 && out.nevents == 0 && kvb_mirror_size(m) == 1,
       "evicted from GPU, still in CPU memory: still held");
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
            s.engine = &e[j];
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
    test_lora_and_extra();
    test_clear_and_bounds();
    test_churn();

    msgpack_sbuffer_destroy(&sb);

    return done_testing();
}
