/*
 * Worst-case holds of the zone lock under adversarial input, on the core
 * code the module links: what one request or one event message can make
 * routing wait for.
 *
 * A request: 128k tokens in 256-byte blocks (2048 blocks), lookup and
 * record under one hold as the balancer does, on a full index.  A message:
 * the largest one accepted (65,536 hashes), applied 2048 hashes a hold as
 * the event path does; a clear, a chunk of KVA_SCAN_CHUNK entries a hold;
 * a status page's count, KVA_COUNT_CHUNK (and KVA_SCAN_CHUNK, as before).
 *
 * Keys: (a) random; (b) all equal in their low 20 bits, which put them all
 * in one bucket before the buckets were keyed; (c) what only the secret
 * allows: every key in a chain already at KVA_CHAIN_MAX, the worst the cap
 * lets anyone build.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kva_rand.h"
#include "kva_index.h"


/* a set of the slots in the low 64 of a mask */
static const kva_slotset_t *
mask_set(uint64_t mask)
{
    static kva_slotset_t  set;

    memset(&set, 0, sizeof(set));
    set.w[0] = mask;

    return &set;
}


#define BLOCKS          2048        /* 128k tokens, 256-byte blocks */
#define MSG_HASHES      65536       /* the largest message accepted */
#define HASH_CHUNK      KVA_ADD_CHUNK   /* the event path's pieces */
#define ROUNDS          8
#define REQ_BUDGET_US   1000.0
#define MSG_BUDGET_US   5000.0


typedef struct {
    kva_index_t        *ix;
    size_t              size;
    const char         *name;
} bench_ix_t;


static uint64_t  rnd_state = 1;


static uint64_t
rnd64(void)
{
    return kva_rand_next(&rnd_state);
}


static uint64_t
old_collider(void)
{
    /* the old bucket was key & (nbuckets - 1): equal low bits, one bucket */
    return (rnd64() << 20) | 0x5a5a5;
}


static void
report(const char *what, double longest, double total, double budget)
{
    char  tot[32];

    if (total > 0) {
        snprintf(tot, sizeof(tot), "%.1f", total);

    } else {
        snprintf(tot, sizeof(tot), "-");
    }

    printf("| %-52s | %8.1f | %9s | %6.0f | %s |\n", what, longest, tot,
           budget, longest <= budget ? "PASS" : "MISS");
}


static void
fill(bench_ix_t *b, int colliding, kva_clock_t *clk)
{
    uint32_t  i, j;
    uint64_t  k[4096];

    b->ix = kva_index_init(b->ix, b->size, rnd64());

    if (b->ix == NULL) {
        exit(1);
    }

    /* the capacity and a bit: full, and evicting */
    for (i = 0; i < b->ix->capacity + 4096; i += 4096) {
        for (j = 0; j < 4096; j++) {
            k[j] = colliding ? old_collider() : rnd64();
        }

        kva_index_add(b->ix, k, 4096, i / 4096 % 8, KVA_BIT_EVENT, clk);
    }

    clk->now++;
}


/*
 * One request as the balancer makes it: the lookup KVA_ADD_CHUNK blocks a
 * hold, the last piece of it and the first of the record under one hold,
 * then the record KVA_ADD_CHUNK blocks a hold.  Returns the longest hold.
 */
static double
request(kva_index_t *ix, const uint64_t *h, kva_clock_t *clk)
{
    double     t, longest, last;
    uint32_t   depth[KVA_MAX_SLOTS], found[BLOCKS], from, to, n;
    long long      t0;
    kva_slotset_t  alive;

    longest = last = 0;
    alive = *mask_set(0xff);

    for (from = 0; from < BLOCKS && !kva_slotset_empty(&alive); from = n) {
        t0 = bench_now_ns();
        to = BLOCKS - from < KVA_ADD_CHUNK ? BLOCKS : from + KVA_ADD_CHUNK;
        n = kva_index_match_part(ix, h, from, to, &alive, clk, depth, found,
                                 NULL);
        last = (bench_now_ns() - t0) / 1e3;
        longest = last > longest ? last : longest;
    }

    (void) kva_index_match_done(BLOCKS, from, &alive, depth, found);

    /* the record's first piece shares the last lookup piece's hold */
    t0 = bench_now_ns() - (long long) (last * 1e3);

    for (from = 0; from < BLOCKS; from += n) {
        if (from) {
            t0 = bench_now_ns();
        }

        n = BLOCKS - from < KVA_ADD_CHUNK ? BLOCKS - from : KVA_ADD_CHUNK;
        kva_index_add_found(ix, h + from, n, 3, KVA_BIT_LEARNED, clk,
                            found + from);

        t = (bench_now_ns() - t0) / 1e3;
        longest = t > longest ? t : longest;
    }

    return longest;
}


static void
requests(bench_ix_t *b, int colliding, const char *label)
{
    char         what[80];
    double       t, first, again;
    uint32_t     r, i;
    uint64_t     h[BLOCKS];
    kva_clock_t  clk = { 10, 1u << 30, 100, {{ 0xff }} };

    fill(b, colliding, &clk);
    first = again = 0;

    for (r = 0; r < ROUNDS; r++) {
        for (i = 0; i < BLOCKS; i++) {
            h[i] = colliding ? old_collider() : rnd64();
        }

        t = request(b->ix, h, &clk);
        first = t > first ? t : first;

        t = request(b->ix, h, &clk);
        again = t > again ? t : again;
        clk.now++;
    }

    snprintf(what, sizeof(what), "%s, request %s, first", b->name, label);
    report(what, first, 0, REQ_BUDGET_US);
    snprintf(what, sizeof(what), "%s, request %s, again", b->name, label);
    report(what, again, 0, REQ_BUDGET_US);
}


/*
 * (c): for each round, BLOCKS buckets far apart, each chain brought to the
 * cap with the request's key at its tail, so that every lookup walks a
 * whole chain, cold.  A first send gets keys missing from full chains.
 */
static void
requests_capped(bench_ix_t *b)
{
    char         what[80];
    double       t, first, again;
    uint32_t     r, i, j, bk, stride, *have, slot;
    uint64_t     key, *keys, h[BLOCKS];
    kva_clock_t  clk = { 10, 1u << 30, 100, {{ 0xff }} };

    fill(b, 0, &clk);

    stride = b->ix->nbuckets / BLOCKS;
    keys = malloc(sizeof(uint64_t) * ROUNDS * BLOCKS * (KVA_CHAIN_MAX + 1));
    have = calloc(ROUNDS * BLOCKS, sizeof(uint32_t));

    if (keys == NULL || have == NULL) {
        exit(1);
    }

    /* keys for the chosen buckets: KVA_CHAIN_MAX + 1 each */
    for (j = 0; j < ROUNDS * BLOCKS; ) {
        key = rnd64();
        bk = kva_index_bucket(b->ix, key);

        if (bk % stride >= ROUNDS) {
            continue;
        }

        slot = (bk % stride) * BLOCKS + bk / stride;

        if (have[slot] <= KVA_CHAIN_MAX) {
            keys[slot * (KVA_CHAIN_MAX + 1) + have[slot]++] = key;
            j += have[slot] == KVA_CHAIN_MAX + 1;
        }
    }

    /* the request's key first, then KVA_CHAIN_MAX - 1 newer ones */
    for (i = 0; i < ROUNDS * BLOCKS; i++) {
        for (j = 0; j < KVA_CHAIN_MAX; j++) {
            kva_index_add(b->ix, &keys[i * (KVA_CHAIN_MAX + 1) + j], 1, 1,
                          KVA_BIT_EVENT, &clk);
        }
    }

    clk.now++;
    first = again = 0;

    for (r = 0; r < ROUNDS; r++) {
        for (i = 0; i < BLOCKS; i++) {
            h[i] = keys[(r * BLOCKS + i) * (KVA_CHAIN_MAX + 1)];
        }

        t = request(b->ix, h, &clk);
        again = t > again ? t : again;
    }

    for (r = 0; r < ROUNDS; r++) {
        for (i = 0; i < BLOCKS; i++) {
            h[i] = keys[(r * BLOCKS + i) * (KVA_CHAIN_MAX + 1)
                        + KVA_CHAIN_MAX];
        }

        t = request(b->ix, h, &clk);
        first = t > first ? t : first;
    }

    snprintf(what, sizeof(what), "%s, request (c) full chains, hits",
             b->name);
    report(what, again, 0, REQ_BUDGET_US);
    snprintf(what, sizeof(what), "%s, request (c) full chains, misses",
             b->name);
    report(what, first, 0, REQ_BUDGET_US);

    free(have);
    free(keys);
}


/* one message of MSG_HASHES hashes, HASH_CHUNK a hold */
static void
message(bench_ix_t *b, const uint64_t *h, int stored, const char *label,
    kva_clock_t *clk)
{
    char       what[80];
    double     t, longest, total;
    uint32_t   off;
    long long  t0;

    longest = total = 0;

    for (off = 0; off < MSG_HASHES; off += HASH_CHUNK) {
        t0 = bench_now_ns();

        if (stored) {
            kva_index_add(b->ix, h + off, HASH_CHUNK, 5, KVA_BIT_EVENT, clk);

        } else {
            kva_index_del(b->ix, h + off, HASH_CHUNK, 5, KVA_BITS_ALL);
        }

        t = (bench_now_ns() - t0) / 1e3;
        total += t;
        longest = t > longest ? t : longest;
    }

    snprintf(what, sizeof(what), "%s, %s", b->name, label);
    report(what, longest, total, MSG_BUDGET_US);
}


/*
 * A status page's count of the index, chunk entries a hold: anyone may
 * ask for the page at any rate, and every request waits for a hold, so
 * a hold is held to a request's budget.
 */
static void
count(bench_ix_t *b, uint32_t chunk, const char *label, kva_clock_t *clk)
{
    char                     what[80];
    double                   t, longest, total;
    uint32_t                 from;
    long long                t0;
    static kva_slot_count_t  counts[KVA_MAX_SLOTS];

    memset(counts, 0, sizeof(counts));
    longest = total = 0;

    for (from = 0; from < b->ix->high_water; ) {
        t0 = bench_now_ns();
        from = kva_index_count_range(b->ix, clk, from, from + chunk, counts);
        t = (bench_now_ns() - t0) / 1e3;
        total += t;
        longest = t > longest ? t : longest;
    }

    snprintf(what, sizeof(what), "%s, %s", b->name, label);
    report(what, longest, total, REQ_BUDGET_US);
}


static void
messages(bench_ix_t *b)
{
    char         what[80];
    double       t, longest, total;
    uint32_t     i, from;
    uint64_t    *h;
    long long    t0;
    kva_clock_t  clk = { 10, 1u << 30, 100, {{ 0xff }} };

    h = malloc(sizeof(uint64_t) * MSG_HASHES);
    if (h == NULL) {
        exit(1);
    }

    fill(b, 1, &clk);

    for (i = 0; i < MSG_HASHES; i++) {
        h[i] = old_collider();
    }

    message(b, h, 1, "stored 65,536 (b) colliding", &clk);
    message(b, h, 1, "stored 65,536 (b) again", &clk);
    message(b, h, 0, "removed 65,536 (b)", &clk);

    for (i = 0; i < MSG_HASHES; i++) {
        h[i] = rnd64();
    }

    message(b, h, 1, "stored 65,536 (a) random", &clk);

    /* a status page's count of a full index, in its chunks and before */
    fill(b, 0, &clk);
    count(b, KVA_COUNT_CHUNK, "counted for status, 4,096 a hold", &clk);
    count(b, KVA_SCAN_CHUNK, "counted for status, 65,536 a hold", &clk);

    /* a clear of a server that holds every entry: each one freed */
    fill(b, 0, &clk);
    kva_index_add(b->ix, h, MSG_HASHES, 0, KVA_BIT_EVENT, &clk);
    longest = total = 0;

    for (from = 0; from < b->ix->high_water; ) {
        t0 = bench_now_ns();
        from = kva_index_drop_range(b->ix, mask_set(0xff), KVA_BITS_ALL, from,
                                    from + KVA_SCAN_CHUNK);
        t = (bench_now_ns() - t0) / 1e3;
        total += t;
        longest = t > longest ? t : longest;
    }

    snprintf(what, sizeof(what), "%s, cleared (every entry freed)",
             b->name);
    report(what, longest, total, MSG_BUDGET_US);

    free(h);
}


int
main(int argc, char **argv)
{
    size_t       sizes[] = { 32u << 20, 256u << 20 };
    const char  *names[] = { "32m", "256m" };
    unsigned     s;
    bench_ix_t   b;

    printf("worst-case zone-lock holds, microseconds (longest of %d "
           "requests; total of a message)\n\n", ROUNDS);
    printf("| %-52s | %8s | %9s | %6s | |\n", "case", "longest", "total",
           "budget");
    printf("|---|---:|---:|---:|---|\n");

    for (s = 0; s < 2; s++) {
        if (argc > 1 && strcmp(argv[1], names[s]) != 0) {
            continue;
        }

        b.name = names[s];
        b.size = kva_index_region_size(kva_index_capacity_for(sizes[s]));
        b.ix = malloc(b.size);

        if (b.ix == NULL) {
            return 1;
        }

        requests(&b, 0, "(a) random");
        requests(&b, 1, "(b) colliding");
        requests_capped(&b);
        messages(&b);

        free(b.ix);
    }

    return 0;
}
