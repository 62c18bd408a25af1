/*
 * kvsim speaking vLLM (tools/kvsim/kvsim_vllm.c, kvsim_token.c) against
 * kvbridge's decoder and mirror: every batch kvsim can send decodes to
 * what it meant in both encodings and the three hash forms, the
 * pseudo-tokenizer is stable, /tokenize's ids are the ids the cache keys,
 * and the bridge's keys for kvsim's blocks are kvsim's own.
 */

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "kva_keys.h"
#include "kva_token.h"
#include "kvb_mirror.h"
#include "kvb_vllm.h"
#include "kvsim_token.h"
#include "kvsim_vllm.h"
#include "tap.h"


#define BS  4                           /* block size in tokens */


static const kvb_limits_t  lim = { 1 << 20, 1024, 65536 };


static int
decode(msgpack_sbuffer *sb, kvb_batch_t *b)
{
    char  err[128];

    if (kvb_decode(sb->data, sb->size, &lim, b, err, sizeof(err)) != KVB_OK) {
        printf("# decode: %s\n", err);
        return -1;
    }

    return 0;
}


static int
str_is(kvb_str_t s, const char *want)
{
    if (want == NULL) {
        return s.data == NULL;
    }

    return s.data != NULL && s.len == strlen(want)
           && memcmp(s.data, want, s.len) == 0;
}


static int
hashes_are(const kvb_ev_t *e, const uint64_t *want, uint32_t n)
{
    uint32_t  i;
    uint64_t  h;

    if (e->nhashes != n) {
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (kvb_engine_hash(&e->hashes[i], &h) != 0 || h != want[i]) {
            return 0;
        }
    }

    return 1;
}


static int
tokens_are(const kvb_ev_t *e, const uint32_t *want, uint32_t n)
{
    uint32_t  i;

    if (!e->has_tokens || e->ntokens != n) {
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (e->tokens[i].via.u64 != want[i]) {
            return 0;
        }
    }

    return 1;
}


/* each block's extra keys are [name], as vLLM writes an adapter's */
static int
lora_keys_are(const kvb_ev_t *e, const char *name)
{
    uint32_t               i;
    const msgpack_object  *k;

    if (name == NULL) {
        return e->extra_keys == NULL
               || (e->extra_keys->type == MSGPACK_OBJECT_NIL);
    }

    if (e->extra_keys == NULL || e->extra_keys->type != MSGPACK_OBJECT_ARRAY
        || e->extra_keys->via.array.size != e->nhashes)
    {
        return 0;
    }

    for (i = 0; i < e->nhashes; i++) {
        k = &e->extra_keys->via.array.ptr[i];

        if (k->type != MSGPACK_OBJECT_ARRAY || k->via.array.size != 1
            || k->via.array.ptr[0].type != MSGPACK_OBJECT_STR
            || k->via.array.ptr[0].via.str.size != strlen(name)
            || memcmp(k->via.array.ptr[0].via.str.ptr, name, strlen(name))
               != 0)
        {
            return 0;
        }
    }

    return 1;
}


static void
test_round_trip(void)
{
    int               enc, hf, good;
    char              what[64];
    kvs_vev_t         ev[4];
    kvb_batch_t       b;
    msgpack_sbuffer   sb;

    /* the top bit set: int64 sends these negative */
    static const uint64_t  stored[3] = {
        0xfedcba9876543210ULL, 1, 0x8000000000000000ULL
    };
    static const uint64_t  lora[1] = { 0x0123456789abcdefULL };
    static const uint64_t  removed[2] = { 0xffffffffffffffffULL, 42 };
    static const uint32_t  ids[3 * BS] = {
        1, 2, 3, 4, 151935, 0, 7, 8, 9, 10, 11, 12
    };
    static const char     *hname[] = { "uint64", "int64", "bytes" };

    memset(ev, 0, sizeof(ev));

    ev[0].type = KVS_VEV_STORED;
    ev[0].hashes = stored;
    ev[0].nhashes = 3;
    ev[0].has_parent = 1;
    ev[0].parent = 0x9999999999999999ULL;
    ev[0].tokens = ids;
    ev[0].block_size = BS;

    ev[1].type = KVS_VEV_STORED;
    ev[1].hashes = lora;
    ev[1].nhashes = 1;
    ev[1].tokens = ids;
    ev[1].block_size = BS;
    ev[1].lora_name = "adapter-1";

    ev[2].type = KVS_VEV_REMOVED;
    ev[2].hashes = removed;
    ev[2].nhashes = 2;

    ev[3].type = KVS_VEV_CLEARED;

    for (enc = KVS_VENC_MAP; enc <= KVS_VENC_ARRAY; enc++) {
        for (hf = KVS_VHASH_UINT64; hf <= KVS_VHASH_BYTES; hf++) {

            snprintf(what, sizeof(what), "%s, %s",
                     enc == KVS_VENC_MAP ? "map" : "array", hname[hf]);

            msgpack_sbuffer_init(&sb);

            ok(kvs_vllm_encode(&sb, enc, hf, 1795000000.25, 0, ev, 4) == 0,
               "%s: encoded", what);

            good = (decode(&sb, &b) == 0);

            ok(good && b.nevents == 4 && b.unknown == 0 && b.malformed == 0
               && b.ts == 1795000000.25 && b.has_rank && b.rank == 0,
               "%s: a batch of 4 events, ts, rank 0", what);

            if (!good || b.nevents != 4) {
                kvb_batch_free(&b);
                msgpack_sbuffer_destroy(&sb);
                continue;
            }

            ok(b.events[0].type == KVB_EV_STORED
               && hashes_are(&b.events[0], stored, 3)
               && b.events[0].has_parent
               && b.events[0].parent == 0x9999999999999999ULL
               && tokens_are(&b.events[0], ids, 3 * BS)
               && b.events[0].block_size == BS
               && str_is(b.events[0].medium, "GPU")
               && str_is(b.events[0].spec_kind, "full_attention")
               && b.events[0].group_idx == 0
               && str_is(b.events[0].lora_name, NULL)
               && lora_keys_are(&b.events[0], NULL),
               "%s: BlockStored with its parent, ids, GPU, full attention",
               what);

            ok(b.events[1].type == KVB_EV_STORED
               && hashes_are(&b.events[1], lora, 1)
               && !b.events[1].has_parent
               && tokens_are(&b.events[1], ids, BS)
               && str_is(b.events[1].lora_name, "adapter-1")
               && lora_keys_are(&b.events[1], "adapter-1"),
               "%s: an adapter's BlockStored, its name first in extra keys",
               what);

            ok(b.events[2].type == KVB_EV_REMOVED
               && hashes_are(&b.events[2], removed, 2)
               && str_is(b.events[2].medium, "GPU"),
               "%s: BlockRemoved", what);

            ok(b.events[3].type == KVB_EV_CLEARED,
               "%s: AllBlocksCleared", what);

            kvb_batch_free(&b);
            msgpack_sbuffer_destroy(&sb);
        }
    }
}


static void
test_tokenizer(void)
{
    size_t        n, i;
    uint32_t      a[8], c[8];
    kvs_tokens_t  t, u;

    static const char  chat[] =
        "{\"model\":\"m\",\"stream\":true,\"max_tokens\":3,\"messages\":"
        "[{\"role\":\"system\",\"content\":\"You are kind.\"},"
        "{\"role\":\"user\",\"content\":\"Hello there, how are you?\"}]}";
    static const char  tok[] =
        "{\"model\":\"m\",\"add_generation_prompt\":true,\"messages\":"
        "[{\"role\":\"system\",\"content\":\"You are kind.\"},"
        "{\"role\":\"user\",\"content\":\"Hello there, how are you?\"}]}";

    n = kvs_tokenize_text((const uint8_t *) "hello world", 11, a);

    ok(n == 3 && kvs_tokenize_text((const uint8_t *) "hello world", 11, c)
                 == 3 && memcmp(a, c, sizeof(uint32_t) * 3) == 0,
       "pseudo-tokenizer: 4-byte chunks, the same ids twice");

    /* pinned: a change here changes every token key kvsim has published */
    ok(a[0] == (uint32_t) (XXH3_64bits("hell", 4) % KVS_VOCAB)
       && a[2] == (uint32_t) (XXH3_64bits("rld", 3) % KVS_VOCAB),
       "pseudo-tokenizer: id = XXH3-64(chunk) mod %u", KVS_VOCAB);

    ok(a[0] == 67665 && a[1] == 87589 && a[2] == 33592,
       "pseudo-tokenizer: \"hello world\" is 67665 87589 33592");

    for (i = 0; i < n && a[i] < KVS_VOCAB; i++) { /* void */ }

    ok(i == n, "pseudo-tokenizer: ids within the vocabulary");

    ok(kvs_tokens_body((const uint8_t *) chat, sizeof(chat) - 1, &t)
       == KVA_PROMPT_OK
       && kvs_tokens_body((const uint8_t *) tok, sizeof(tok) - 1, &u)
          == KVA_PROMPT_OK
       && !t.from_body && t.n > 8 && t.n == u.n
       && memcmp(t.ids, u.ids, t.n * sizeof(uint32_t)) == 0,
       "/tokenize of the messages: the ids the chat request's blocks use");

    ok(t.n == (t.tb.p.out_len + 3) / 4 && t.tb.p.model_len == 1,
       "a token per 4 bytes of the canonical prompt, as text mode counts");

    kvs_tokens_free(&t);
    kvs_tokens_free(&u);

    ok(kvs_tokens_body((const uint8_t *) "{\"prompt\":[5, 0,4294967295]}",
                       28, &t) == KVA_PROMPT_OK
       && t.from_body && t.n == 3 && t.ids[0] == 5 && t.ids[1] == 0
       && t.ids[2] == 4294967295u,
       "a prompt of token ids is those ids");
    kvs_tokens_free(&t);

    ok(kvs_tokens_body((const uint8_t *) "{\"prompt\":\"hello world\"}",
                       24, &t) == KVA_PROMPT_OK
       && !t.from_body && t.n == 3
       && t.ids[0] == a[0] && t.ids[1] == a[1]
       && kvs_tokenize_text((const uint8_t *) "rld\x1e", 4, c) == 1
       && t.ids[2] == c[0],
       "a text prompt: its canonical form, 0x1e after the string");
    kvs_tokens_free(&t);

    ok(kvs_tokens_body((const uint8_t *) "{\"prompt\":[1,2.5]}", 18, &t)
       == KVA_PROMPT_OK && !t.from_body,
       "a list that is not all ids: the pseudo-tokenizer");
    kvs_tokens_free(&t);

    ok(kvs_tokens_body((const uint8_t *) "{\"model\":\"m\"}", 13, &t)
       == KVA_PROMPT_NO_PROMPT && !t.nomem,
       "no prompt: refused");
    kvs_tokens_free(&t);
}


/*
 * What kvsim stores for a request and what it tells the bridge: the
 * bridge's mirror recomputes the module's keys from the event's ids, and
 * they must be kvsim's cache keys, for the base model and an adapter.
 */
static void
test_bridge_keys(void)
{
    int             k;
    size_t          n, b, i;
    uint64_t        keys[64], eh[64], salt, prev, *kp;
    kvs_vev_t       ev;
    kvs_tokens_t    t;
    kva_batch_t     out;
    kvb_batch_t     in;
    kvb_mirror_t   *m;
    msgpack_sbuffer sb;

    static const char  *models[] = { "kvsim", "adapter-1" };
    static const char   fmt[] =
        "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"The quick brown fox jumps over the lazy dog, and then it runs "
        "far away into the forest where nobody finds it again.\"}]}";
    char                body[512];

    for (k = 0; k < 2; k++) {
        snprintf(body, sizeof(body), fmt, models[k]);

        if (kvs_tokens_body((const uint8_t *) body, strlen(body), &t)
            != KVA_PROMPT_OK)
        {
            ok(0, "%s: tokenized", models[k]);
            continue;
        }

        /* as kvsim_request.c keys a sequence */
        n = kvs_tokens_keys(&t, "kvsim", BS, &kp);

        if (kp == NULL || n > 64) {
            ok(0, "%s: keyed", models[k]);
            free(kp);
            kvs_tokens_free(&t);
            continue;
        }

        memcpy(keys, kp, n * sizeof(uint64_t));
        free(kp);

        salt = kvs_vllm_salt(models[k], strlen(models[k]));
        prev = 0x5eed;

        for (b = 0; b < n; b++) {
            prev = kvs_vllm_hash(prev, salt, &t.ids[b * BS], BS);
            eh[b] = prev;
        }

        ok(n > 4 && eh[0] != keys[0] && eh[1] != eh[0],
           "%s: %zu blocks, engine hashes that are not our keys",
           models[k], n);

        memset(&ev, 0, sizeof(ev));
        ev.type = KVS_VEV_STORED;
        ev.hashes = eh;
        ev.nhashes = n;
        ev.tokens = t.ids;
        ev.block_size = BS;
        ev.lora_name = k ? models[k] : NULL;

        msgpack_sbuffer_init(&sb);
        m = kvb_mirror_create("kvsim", 1024);
        memset(&out, 0, sizeof(out));

        ok(m != NULL
           && kvs_vllm_encode(&sb, KVS_VENC_MAP, KVS_VHASH_UINT64, 0.0, 0,
                              &ev, 1) == 0
           && decode(&sb, &in) == 0
           && kvb_mirror_apply(m, &in, &out) == 0
           && out.nevents == 1 && out.events[0].type == KVA_EV_STORED
           && out.events[0].nhashes == n,
           "%s: the bridge takes kvsim's batch", models[k]);

        for (i = 0; out.nevents == 1 && i < n
                    && out.events[0].hashes[i] == keys[i]; i++)
        {
            /* void */
        }

        ok(i == n, "%s: the bridge's keys are kvsim's cache keys",
           models[k]);

        kva_batch_free(&out);
        kvb_batch_free(&in);
        kvb_mirror_destroy(m);
        msgpack_sbuffer_destroy(&sb);
        kvs_tokens_free(&t);
    }
}


/*
 * The module's keys (src/ngx_http_kv_aware_prompt.c: kva_keys.h called
 * as it calls it) and kvsim's for the same bodies agree: token keys from
 * the body's own ids, or from the ids kvsim's /tokenize answers, salted
 * or not; and text keys, which keys=tokens falls back to without ids.
 */
static void
test_module_keys(void)
{
    size_t             i, n, m, max;
    uint8_t           *scratch;
    uint64_t          *kv, mk[256];
    kvs_tokens_t       t;
    kva_prompt_t       p;
    kva_token_body_t   tb;

    static const char  *bodies[] = {
        "{\"model\":\"kvsim\",\"prompt\":[1,2,3,4,5,6,7,8,9,10,11]}",
        "{\"prompt\":[7,0,4294967295,8,1,2,3,4],\"model\":\"adapter-1\","
        "\"cache_salt\":\"s\\u00e9\"}",
        "{\"model\":\"kvsim\",\"cache_salt\":\"s1\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"You are a helpful assistant "
        "who answers in full sentences.\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"Tell me about \\\"foxes\\\".\"}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
        "\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
        "{\"model\":\"kvsim\",\"prompt\":\"The quick brown fox jumps over "
        "the lazy dog.\"}"
    };

    for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        n = 0;
        kv = NULL;

        if (kvs_tokens_body((const uint8_t *) bodies[i], strlen(bodies[i]),
                            &t) == KVA_PROMPT_OK)
        {
            n = kvs_tokens_keys(&t, "kvsim", BS, &kv);
        }

        /* the module, keys=tokens, with kvsim's /tokenize as tokenizer */
        memset(&tb, 0, sizeof(tb));
        tb.block_size = 4 * BS;
        tb.block_tokens = BS;
        scratch = malloc(kva_token_body_scratch(strlen(bodies[i])));
        m = (size_t) -1;

        if (scratch != NULL
            && kva_token_body((const uint8_t *) bodies[i], strlen(bodies[i]),
                              scratch, &tb) == KVA_PROMPT_OK)
        {
            max = kva_token_body_max(&tb, tb.from_body ? NULL : t.ids, t.n);
            m = kva_token_body_keys(&tb, mk, max < 256 ? max : 256);
        }

        ok(kv != NULL && n > 0 && m == n
           && memcmp(kv, mk, n * sizeof(uint64_t)) == 0
           && tb.from_body == t.from_body,
           "body %zu: the module's token keys are kvsim's (%zu blocks, %s)",
           i, n, t.from_body ? "its ids" : "/tokenize's ids");

        /* without ids: text keys, as kvsim --keyspace text hashes */
        if (t.from_body) {
            goto next;
        }

        memset(&tb, 0, sizeof(tb));
        tb.block_size = 4 * BS;
        tb.block_tokens = BS;
        m = (size_t) -1;

        if (scratch != NULL
            && kva_token_body((const uint8_t *) bodies[i], strlen(bodies[i]),
                              scratch, &tb) == KVA_PROMPT_OK)
        {
            max = kva_token_body_max(&tb, NULL, 0);
            m = kva_token_body_keys(&tb, mk, max < 256 ? max : 256);
        }

        free(kv);
        kv = malloc((kva_hash_body_max(strlen(bodies[i]), 4 * BS) + 1)
                    * sizeof(uint64_t));

        ok(kv != NULL
           && kva_hash_body((const uint8_t *) bodies[i], strlen(bodies[i]),
                            4 * BS, NULL, kv, &n, &p) == KVA_PROMPT_OK
           && m == n && n > 0 && memcmp(kv, mk, n * sizeof(uint64_t)) == 0,
           "body %zu: keys=tokens without ids: kvsim's text keys (%zu)",
           i, n);

    next:

        free(kv);
        free(scratch);
        kvs_tokens_free(&t);
    }
}


int
main(void)
{
    test_round_trip();
    test_tokenizer();
    test_bridge_keys();
    test_module_keys();

    return done_testing();
}
