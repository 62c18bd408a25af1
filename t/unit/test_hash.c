/*
 * Unit tests of the chained block hashes (src/core/kva_hash.c).
 */

#include <string.h>
#include <xxhash.h>

#include "tap.h"
#include "kva_hash.h"


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

    return done_testing();
}
