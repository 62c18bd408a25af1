/*
 * Unit tests of the chained block hashes (src/core/kva_hash.c).
 */

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "tap.h"
#include "kva_keys.h"


static void test_text(void);
static void test_stream(void);
static void test_body(void);
static void test_split(void);


int
main(void)
{
    size_t    n, i;
    uint8_t   a[1000], b[1000];
    uint64_t  ha[16], hb[16], seed, other, h;

    for (i = 0; i < sizeof(a); i++) {
        a[i] = (uint8_t) ('a' + i % 26);
    }

    memcpy(b, a, sizeof(b));
    b[600] ^= 1;                       /* differs in block 2 of 256 */

    seed = kva_hash_seed(KVA_KEYSPACE_TEXT, (const uint8_t *) "m", 1);
    other = kva_hash_seed(KVA_KEYSPACE_TEXT, (const uint8_t *) "n", 1);

    ok(seed != other, "models seed different chains");

    n = kva_hash_blocks(seed, a, sizeof(a), 256, ha, 16);
    ok(n == 3, "only full blocks count (%zu of 1000 bytes / 256)", n);

    kva_hash_blocks(seed, b, sizeof(b), 256, hb, 16);
    ok(ha[0] == hb[0] && ha[1] == hb[1] && ha[2] != hb[2],
       "a change ends the common prefix where it is");

    /* 128-byte pieces, each seeded with the hash before it */
    h = XXH3_64bits_withSeed(a, 128, seed);
    h = XXH3_64bits_withSeed(a + 128, 128, h);
    ok(ha[0] == h, "h[0] chains the pieces of block 0 from the seed");
    h = XXH3_64bits_withSeed(a + 256, 128, h);
    h = XXH3_64bits_withSeed(a + 384, 128, h);
    ok(ha[1] == h, "h[1] chains on from h[0]");

    ok(kva_hash_blocks(seed, a, 100, 100, hb, 16) == 1
       && hb[0] == XXH3_64bits_withSeed(a, 100, seed),
       "a block of at most one piece is one XXH3 call");
    ok(kva_hash_blocks(seed, a, 300, 300, hb, 16) == 1
       && hb[0] == XXH3_64bits_withSeed(a + 256, 44,
                   XXH3_64bits_withSeed(a + 128, 128,
                   XXH3_64bits_withSeed(a, 128, seed))),
       "the last piece of a block may be shorter");

    kva_hash_blocks(other, a, sizeof(a), 256, hb, 16);
    ok(ha[0] != hb[0] && ha[2] != hb[2], "another model: no shared hash");

    /* the chain makes a block's hash depend on everything before it */
    memcpy(b, a, sizeof(b));
    memcpy(b, a + 256, 256);
    kva_hash_blocks(seed, b, sizeof(b), 256, hb, 16);
    ok(hb[1] != ha[1] && hb[2] != ha[2], "same block, other prefix: differs");

    ok(kva_hash_blocks(seed, a, sizeof(a), 256, ha, 2) == 2,
       "max_blocks caps the output");
    ok(kva_hash_blocks(seed, a, 255, 256, ha, 16) == 0, "short prompt: none");

    test_text();
    test_stream();
    test_body();
    test_split();

    return done_testing();
}


static uint64_t
fold(uint64_t c, const char *model)
{
    size_t   i;
    uint8_t  le[8];

    for (i = 0; i < 8; i++) {
        le[i] = (uint8_t) (c >> (8 * i));
    }

    return XXH3_64bits_withSeed(le, 8,
               XXH3_64bits_withSeed(model, strlen(model), KVA_KEYSPACE_TEXT));
}


/* the text key space: the chain from the key space, the model last */

static void
test_text(void)
{
    size_t    i;
    uint8_t   a[600];
    uint64_t  h[4], other[4], c;

    for (i = 0; i < sizeof(a); i++) {
        a[i] = (uint8_t) ('a' + i % 23);
    }

    ok(kva_hash_text((const uint8_t *) "m", 1, a, sizeof(a), 256, h, 4) == 2,
       "text: full blocks only");

    c = XXH3_64bits_withSeed(a + 128, 128,
            XXH3_64bits_withSeed(a, 128, KVA_KEYSPACE_TEXT));
    ok(h[0] == fold(c, "m"),
       "text: h[0] = XXH3(c[0] as 8 bytes LE, seed = XXH3(model, "
       "seed = kva-text))");

    c = XXH3_64bits_withSeed(a + 384, 128,
            XXH3_64bits_withSeed(a + 256, 128, c));
    ok(h[1] == fold(c, "m"), "text: the chain runs on without the model");

    kva_hash_text((const uint8_t *) "n", 1, a, sizeof(a), 256, other, 4);
    ok(other[0] != h[0] && other[1] != h[1], "text: another model, no "
       "shared hash");
    {
        size_t    k, bad;
        uint8_t   le[8];
        uint64_t  x, m;

        bad = 0;
        x = 0x9e3779b97f4a7c15ULL;

        for (k = 0; k < 10000; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            m = x * 0xff51afd7ed558ccdULL;

            for (i = 0; i < 8; i++) {
                le[i] = (uint8_t) (x >> (8 * i));
            }

            bad += (kva_hash_fold(x, m) != XXH3_64bits_withSeed(le, 8, m));
        }

        ok(bad == 0, "fold: XXH3 of the 8 bytes with the seed, as the "
           "library computes it (10,000 values, %zu differ)", bad);
    }

    ok(kva_hash_fold(123, 1) != kva_hash_fold(123, 2)
       && kva_hash_fold(123, 1) != kva_hash_fold(124, 1), "fold: both count");
}


/* runs of any length, in any cut, hash as the whole */

static void
test_stream(void)
{
    size_t             i, bs, cut, n, ok_all;
    uint8_t            a[2000];
    uint64_t           ref[64], h[64];
    kva_hash_stream_t  hs;

    static const size_t  sizes[] = { 1, 7, 100, 128, 129, 256, 300, 1000 };

    for (i = 0; i < sizeof(a); i++) {
        a[i] = (uint8_t) (i * 131 + (i >> 7));
    }

    ok_all = 1;

    for (bs = 0; bs < sizeof(sizes) / sizeof(sizes[0]); bs++) {
        for (cut = 1; cut < 300; cut += 37) {
            n = kva_hash_text((const uint8_t *) "m", 1, a, sizeof(a),
                              sizes[bs], ref, 64);

            kva_hash_stream_init(&hs, sizes[bs], h, 64);

            for (i = 0; i < sizeof(a); i += cut) {
                kva_hash_feed(&hs, a + i,
                              sizeof(a) - i < cut ? sizeof(a) - i : cut);
            }

            if (kva_hash_stream_end(&hs, (const uint8_t *) "m", 1) != n
                || memcmp(h, ref, n * sizeof(uint64_t)) != 0)
            {
                printf("# block %zu, runs of %zu: differ\n", sizes[bs], cut);
                ok_all = 0;
            }
        }
    }

    ok(ok_all, "stream: runs of 1 to 260 bytes hash as the whole, "
       "blocks of 1 to 1000 bytes, 64 at most");

    kva_hash_text((const uint8_t *) "m", 1, a, sizeof(a), 256, ref, 64);
    kva_hash_stream_init(&hs, 256, h, 3);
    kva_hash_feed(&hs, a, sizeof(a));
    ok(kva_hash_stream_end(&hs, (const uint8_t *) "m", 1) == 3
       && memcmp(h, ref, 3 * sizeof(uint64_t)) == 0,
       "stream: max_blocks caps it");

    kva_hash_stream_init(&hs, 0, h, 3);
    kva_hash_feed(&hs, a, sizeof(a));
    ok(kva_hash_stream_end(&hs, (const uint8_t *) "m", 1) == 0,
       "stream: block size 0 hashes nothing");
}


/* the model may come before or after the messages */

static void
test_body(void)
{
    char             body[3][2048], text[1200];
    size_t           len[3], n[3], i;
    uint64_t         h[3][16];
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    for (i = 0; i < sizeof(text) - 1; i++) {
        text[i] = (char) ('a' + i % 26);
    }

    text[sizeof(text) - 1] = '\0';

    len[0] = snprintf(body[0], sizeof(body[0]), "{\"model\":\"m\","
                      "\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"%s\"}]}", text);
    len[1] = snprintf(body[1], sizeof(body[1]), "{\"messages\":[{\"role\":"
                      "\"user\",\"content\":\"%s\"}],\"model\":\"m\"}",
                      text);
    len[2] = snprintf(body[2], sizeof(body[2]), "{\"messages\":[{\"role\":"
                      "\"user\",\"content\":\"%s\"}],\"model\":\"n\"}",
                      text);

    for (i = 0; i < 3; i++) {
        rc = kva_hash_body((const uint8_t *) body[i], len[i], 256, NULL,
                           h[i], &n[i], &p);

        if (rc != KVA_PROMPT_OK) {
            n[i] = 0;
        }
    }

    ok(n[0] == 4 && n[1] == 4
       && memcmp(h[0], h[1], sizeof(h[0][0]) * 4) == 0,
       "body: the model after the messages hashes as before them");
    ok(n[2] == 4 && h[2][0] != h[1][0] && h[2][3] != h[1][3],
       "body: another model, no shared hash");
    ok(kva_hash_body((const uint8_t *) body[0], len[0] - 1, 256, NULL,
                     h[0], &n[0], &p) == KVA_PROMPT_NOT_JSON && n[0] == 0,
       "body: a malformed body hashes nothing");
}


/* a body in two pieces hashes as in one, cut anywhere */

static void
test_split(void)
{
    char             body[4096], digits[101];
    size_t           len, cut, n, n2, bad;
    uint8_t          win[4096 + KVA_HASH_SEAM];
    uint64_t         h[64], h2[64];
    kva_prompt_t     p;
    kva_prompt_rc_e  rc;

    len = snprintf(body, sizeof(body), "{\"messages\": [{\"role\":"
                   "\"user\",\"content\":\"%0600d\\n\\u00e9 caf\u00e9 "
                   "\\ud83d\\ude00 %0500d\"}], \"tools\":[{\"a\":[true,"
                   "null,-1.5e3]}],\"model\" : \"m\"  }", 7, 9);

    if (kva_hash_body((const uint8_t *) body, len, 64, NULL, h, &n, &p)
        != KVA_PROMPT_OK)
    {
        n = 0;
    }

    bad = 0;

    for (cut = 0; cut <= len; cut++) {
        rc = kva_hash_body2((const uint8_t *) body, cut,
                            (const uint8_t *) body + cut, len - cut, 64, win,
                            h2, &n2, &p);

        if (rc != KVA_PROMPT_OK || n2 != n
            || memcmp(h, h2, n * sizeof(uint64_t)) != 0)
        {
            bad++;
        }
    }

    ok(n > 0 && bad == 0, "split: every cut of a %zu-byte body hashes as "
       "the whole (%zu cuts differ)", len, bad);

    bad = 0;

    /* the last byte dropped: cuts up to len - 1 (past it b would be -1) */
    for (cut = 0; cut < len; cut++) {
        rc = kva_hash_body2((const uint8_t *) body, cut,
                            (const uint8_t *) body + cut, len - cut - 1, 64,
                            win, h2, &n2, &p);

        if (rc != KVA_PROMPT_NOT_JSON || n2 != 0) {
            bad++;
        }
    }

    ok(bad == 0, "split: cut short, every cut says not json (%zu differ)",
       bad);

    memset(digits, '7', 100);
    digits[100] = '\0';
    len = snprintf(body, sizeof(body), "{\"n\":%s,\"prompt\":\"x\"}",
                   digits);
    rc = kva_hash_body2((const uint8_t *) body, 10,
                        (const uint8_t *) body + 10, len - 10, 64, win, h2,
                        &n2, &p);
    ok(rc == KVA_PROMPT_SEAM && n2 == 0,
       "split: a 100-digit number across the seam: hash a copy");
    rc = kva_hash_body2((const uint8_t *) body, 60,
                        (const uint8_t *) body + 60, len - 60, 64, win, h2,
                        &n2, &p);
    ok(rc == KVA_PROMPT_OK, "split: past the number, no copy needed");
}
