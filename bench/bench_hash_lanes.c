/*
 * Is the block hash chain latency-bound?  Times the text key space's
 * chain over a 32 KB prompt (8k tokens, 256-byte blocks, as bench/wrk.sh
 * sends) against definitions that hash each block as an independent lane
 * and chain only the 8-byte results, so that the CPU could overlap the
 * blocks.  A new definition is worth a version bump of docs/events.md
 * only if it saves at least 1 us a request here.
 *
 * chain:        the definition (kva_hash_blocks(), libxxhash's calls)
 * chain inline: the same with XXH3 inlined, specialized by the compiler
 * lanes 2x128:  each 128-byte piece unseeded, the block's two results
 *               and the chain value hashed together (16 bytes + seed)
 * lanes 1x256:  each block in one call (XXH3's long path, its SIMD),
 *               the result folded into the chain (8 bytes + seed)
 *
 * Each "inline" row has XXH3 compiled into this file at -O2 for the
 * baseline x86-64 (SSE2); the library is what the module calls.  Prints
 * the best of 50 means of 200 prompts, in us a prompt, the rows timed in
 * turn.
 */

#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "bench_util.h"
#include "kva_hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>


#define LEN         32768
#define BS          256
#define NBLOCKS     (LEN / BS)
#define RUNS        50
#define PROMPTS     200


static uint8_t   text[LEN];
static uint64_t  out[NBLOCKS];


static void
chain_lib(void)
{
    (void) kva_hash_blocks(KVA_KEYSPACE_TEXT, text, LEN, BS, out, NBLOCKS);
}


static void
chain_inline(void)
{
    size_t    i, off;
    uint64_t  h;

    h = KVA_KEYSPACE_TEXT;

    for (i = 0; i < NBLOCKS; i++) {
        for (off = 0; off < BS; off += KVA_HASH_PIECE) {
            h = XXH3_64bits_withSeed(text + i * BS + off, KVA_HASH_PIECE, h);
        }

        out[i] = h;
    }
}


static void
lanes_2x128(void)
{
    size_t    i;
    uint64_t  h, two[2];

    h = KVA_KEYSPACE_TEXT;

    for (i = 0; i < NBLOCKS; i++) {
        two[0] = XXH3_64bits(text + i * BS, 128);
        two[1] = XXH3_64bits(text + i * BS + 128, 128);
        h = XXH3_64bits_withSeed(two, sizeof(two), h);
        out[i] = h;
    }
}


static void
lanes_1x256(void)
{
    size_t    i;
    uint64_t  h, lane;

    h = KVA_KEYSPACE_TEXT;

    for (i = 0; i < NBLOCKS; i++) {
        lane = XXH3_64bits(text + i * BS, BS);
        h = XXH3_64bits_withSeed(&lane, sizeof(lane), h);
        out[i] = h;
    }
}


static double
mean_us(void (*f)(void))
{
    int        k;
    long long  t0;

    t0 = bench_now_ns();

    for (k = 0; k < PROMPTS; k++) {
        f();
        __asm__ volatile("" : : "r" (out) : "memory");
    }

    return (double) (bench_now_ns() - t0) / PROMPTS / 1e3;
}


int
main(void)
{
    int       r;
    size_t    i;
    double    t, best[4];
    unsigned  k;

    static const struct {
        const char  *name;
        void       (*f)(void);
    } rows[] = {
        { "chain (the definition)", chain_lib },
        { "chain, inline", chain_inline },
        { "lanes 2x128, inline", lanes_2x128 },
        { "lanes 1x256, inline", lanes_1x256 },
    };

    /* words of 3 letters and a space, as bench/wrk_bodies.lua writes */
    for (i = 0; i < LEN; i++) {
        text[i] = (i % 4 == 3) ? ' ' : (uint8_t) ('a' + (i * 13 + i / 4) % 26);
    }

    printf("32 KB in %d-byte blocks, best of %d means of %d prompts\n\n",
           BS, RUNS, PROMPTS);
    printf("| hash | us a prompt | saved against the chain |\n");
    printf("|---|---:|---:|\n");

    /* the rows in turn, each its best: a loaded machine slows them alike */
    for (k = 0; k < 4; k++) {
        best[k] = 1e18;
    }

    for (r = 0; r < RUNS; r++) {
        for (k = 0; k < 4; k++) {
            t = mean_us(rows[k].f);
            best[k] = (t < best[k]) ? t : best[k];
        }
    }

    for (k = 0; k < 4; k++) {
        printf("| %s | %.2f | %.2f |\n", rows[k].name, best[k],
               best[0] - best[k]);
    }

    printf("\na new definition pays if it saves >= 1 us a prompt\n");

    return 0;
}
