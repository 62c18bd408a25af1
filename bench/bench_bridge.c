/*
 * kvbridge's cost on one core: engine block hashes in per second through
 * what the bridge does with every batch an engine publishes, sockets
 * aside: the scan and msgpack-c's unpacking (kvb_decode), the mirror
 * (engine hash -> our key, the token keys computed from the ids), and the
 * module's JSON message out (kva_event_encode).
 *
 * An engine step in vLLM 0.26's encoding: one BlockStored of a new
 * request's chain of BLOCKS blocks of 16 token ids, and one BlockRemoved
 * of a chain stored KEEP steps before, so that the mirror stays at
 * KEEP * BLOCKS blocks.  The goal: at least 1M hashes a second.
 *
 *   make $PWD/build/bench_bridge && build/bench_bridge
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "bench_util.h"
#include "kva_event.h"
#include "kva_rand.h"
#include "kvb_mirror.h"
#include "kvb_vllm.h"


#define RUNS       5
#define RUN_NS     400000000LL
#define STEPS      2048             /* batches made, replayed in a ring */
#define KEEP       1024             /* chains held */
#define TOKENS     16               /* a block */


typedef struct {
    char       *data;
    size_t      len;
    size_t      hashes;             /* stored + removed */
} bench_batch_t;


static void bench_pack_str(msgpack_packer *pk, const char *s);
static void bench_make(bench_batch_t *b, size_t blocks);
static double bench_run(bench_batch_t *b, size_t blocks, double *us_batch);


static volatile size_t  sink;


int
main(void)
{
    size_t          i, blocks[] = { 1, 16, 64, 256 };
    double          rate, us;
    bench_batch_t  *b;

    b = calloc(STEPS, sizeof(bench_batch_t));
    if (b == NULL) {
        return 1;
    }

    printf("kvbridge, one core: decode + mirror + encode, per engine step\n"
           "%-28s %14s %12s %8s\n", "step", "hashes/s", "us/batch",
           "goal");

    for (i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++) {
        bench_make(b, blocks[i]);
        rate = bench_run(b, blocks[i], &us);

        printf("store %3zu + remove %3zu blocks %14.0f %12.2f %8s\n",
               blocks[i], blocks[i], rate, us,
               rate >= 1e6 ? "met" : "MISSED");
    }

    return 0;
}


/*
 * STEPS batches: step s stores chain s and removes chain s - KEEP, both
 * modulo STEPS, so that the ring replays in a steady state
 */

static void
bench_make(bench_batch_t *b, size_t blocks)
{
    size_t            s, i, gone;
    uint64_t          rng, salt;
    msgpack_packer    pk;
    msgpack_sbuffer   sb;

    rng = 42;
    salt = kva_rand_next(&rng);

    for (s = 0; s < STEPS; s++) {
        free(b[s].data);
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);

        msgpack_pack_map(&pk, 3);
        bench_pack_str(&pk, "ts");
        msgpack_pack_double(&pk, (double) s);
        bench_pack_str(&pk, "events");
        msgpack_pack_array(&pk, 2);

        msgpack_pack_map(&pk, 8);
        bench_pack_str(&pk, "type");
        bench_pack_str(&pk, "BlockStored");
        bench_pack_str(&pk, "block_hashes");
        msgpack_pack_array(&pk, blocks);

        for (i = 0; i < blocks; i++) {
            msgpack_pack_uint64(&pk, (salt ^ (s << 20)) + i);
        }

        bench_pack_str(&pk, "parent_block_hash");
        msgpack_pack_nil(&pk);
        bench_pack_str(&pk, "token_ids");
        msgpack_pack_array(&pk, blocks * TOKENS);

        for (i = 0; i < blocks * TOKENS; i++) {
            msgpack_pack_uint32(&pk,
                                (uint32_t) kva_rand_below(&rng, 151936));
        }

        bench_pack_str(&pk, "block_size");
        msgpack_pack_int(&pk, TOKENS);
        bench_pack_str(&pk, "medium");
        bench_pack_str(&pk, "GPU");
        bench_pack_str(&pk, "group_idx");
        msgpack_pack_int(&pk, 0);
        bench_pack_str(&pk, "kv_cache_spec_kind");
        bench_pack_str(&pk, "full_attention");

        gone = (s + STEPS - KEEP) % STEPS;

        msgpack_pack_map(&pk, 3);
        bench_pack_str(&pk, "type");
        bench_pack_str(&pk, "BlockRemoved");
        bench_pack_str(&pk, "block_hashes");
        msgpack_pack_array(&pk, blocks);

        for (i = 0; i < blocks; i++) {
            msgpack_pack_uint64(&pk, (salt ^ (gone << 20)) + i);
        }

        bench_pack_str(&pk, "medium");
        bench_pack_str(&pk, "GPU");

        bench_pack_str(&pk, "data_parallel_rank");
        msgpack_pack_int(&pk, 0);

        b[s].data = sb.data;
        b[s].len = sb.size;
        b[s].hashes = 2 * blocks;
    }
}


/* the median over RUNS of hashes per second */

static double
bench_run(bench_batch_t *b, size_t blocks, double *us_batch)
{
    int            r;
    char           err[128], *msg;
    size_t         s, n, hashes, len;
    double         rates[RUNS], per[RUNS];
    long long      start, t;
    kva_batch_t    out;
    kvb_batch_t    in;
    kvb_mirror_t  *m;
    kvb_limits_t   lim = { 4 << 20, 65536, 1 << 20 };

    m = kvb_mirror_create("meta-llama/Llama-3.1-8B-Instruct",
                          2 * KEEP * blocks + 1024);
    if (m == NULL) {
        return 0;
    }

    s = 0;

    for (r = 0; r < RUNS; r++) {
        start = bench_now_ns();
        n = 0;
        hashes = 0;

        do {
            if (kvb_decode(b[s].data, b[s].len, &lim, &in, err, sizeof(err))
                != KVB_OK)
            {
                fprintf(stderr, "decode: %s\n", err);
                exit(1);
            }

            memset(&out, 0, sizeof(out));
            (void) kvb_mirror_apply(m, &in, &out);
            kvb_batch_free(&in);

            strcpy(out.server, "10.0.0.11:8000");
            out.server_len = 14;
            out.seq = n + 1;
            out.keyspace = KVA_KEYSPACE_TOKEN_KEYS;

            msg = kva_event_encode(&out, &len);
            sink += len;
            free(msg);
            kva_batch_free(&out);

            hashes += b[s].hashes;
            s = (s + 1) % STEPS;
            n++;

            t = bench_now_ns() - start;
        } while (t < RUN_NS);

        rates[r] = hashes * 1e9 / t;
        per[r] = t / 1e3 / n;
    }

    kvb_mirror_destroy(m);

    qsort(rates, RUNS, sizeof(double), bench_cmp_double);
    qsort(per, RUNS, sizeof(double), bench_cmp_double);
    *us_batch = per[RUNS / 2];

    (void) blocks;

    return rates[RUNS / 2];
}


static void
bench_pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}
