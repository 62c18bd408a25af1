/*
 * In-process routing cost: parse + hash + lookup + score + record, the work
 * the balancer does per request, on the same core code the module links.
 *
 * Prints the median and p99 per case against the project's budget.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kva_rand.h"
#include "kva_keys.h"
#include "kva_index.h"
#include "kva_prompt.h"
#include "kva_score.h"


#define BLOCK_SIZE  256


/* a chat body of about `tokens` 4-byte pseudo-tokens */
static char *
make_body(size_t tokens, int escapes, size_t *len)
{
    char      *body, *p;
    size_t     i, text;
    uint64_t   s = 42;

    text = tokens * 4;
    body = malloc(text * 2 + 256);
    if (body == NULL) {
        exit(1);
    }

    p = body + sprintf(body, "{\"model\":\"qwen3-32b\",\"stream\":true,"
                       "\"messages\":[{\"role\":\"system\",\"content\":\"");

    for (i = 0; i < text; i++) {
        if (escapes && i % 61 == 60) {
            p += sprintf(p, (i / 61) % 3 == 0 ? "\\n"
                            : (i / 61) % 3 == 1 ? "\\\"" : "\\u00e9");
            continue;
        }

        *p++ = "abcdefghijklmnopqrstuvwxyz 0123456789"[kva_rand_below(&s, 37)];
    }

    p += sprintf(p, "\"},{\"role\":\"user\",\"content\":\"Summarise.\"}],"
                 "\"max_tokens\":100}");
    *len = p - body;

    return body;
}


static void
run_case(size_t tokens, int escapes, unsigned servers, uint32_t entries,
    double budget)
{
    char              *body;
    void              *region;
    size_t             len, size, n, iters, i;
    double            *t, t0, med, p99;
    uint32_t           depth[KVA_MAX_SLOTS], j, *found;
    uint64_t          *hashes, s, filler[1024];
    unsigned           k;
    kva_why_e          why;
    kva_clock_t        clk = { 100, 1u << 30, 100, {{ 0 }} };
    kva_index_t       *ix;
    kva_slotset_t      mask;
    kva_prompt_t       p;
    kva_candidate_t    cand[KVA_MAX_SLOTS];
    kva_score_conf_t   conf = { 2.0, 32, 1.5, 0.5, KVA_COST_LOAD,
                                { 0.25, 0.5 } };

    body = make_body(tokens, escapes, &len);
    hashes = malloc((kva_hash_body_max(len, BLOCK_SIZE) + 1)
                    * sizeof(uint64_t));
    found = malloc((kva_hash_body_max(len, BLOCK_SIZE) + 1)
                   * sizeof(uint32_t));

    size = kva_index_region_size(entries + entries / 4 + 4096);
    region = malloc(size);
    ix = kva_index_init(region, size, 0x9e3779b97f4a7c15ULL);

    if (hashes == NULL || found == NULL || region == NULL
        || ix == NULL)
    {
        exit(1);
    }

    /* fill the index with unrelated prefixes spread over the servers */
    s = 7;

    for (j = 0; j < entries; j += 1024) {
        for (i = 0; i < 1024; i++) {
            filler[i] = kva_rand_next(&s);
        }

        kva_index_add(ix, filler, entries - j < 1024 ? entries - j : 1024,
                      (unsigned) (j / 1024) % servers, KVA_BIT_LEARNED, &clk);
    }

    kva_slotset_zero(&mask);
    memset(cand, 0, sizeof(cand));

    for (k = 0; k < servers; k++) {
        kva_slotset_add(&mask, k);
        cand[k].weight = 1;
        cand[k].inflight_reqs = k % 3;
    }

    iters = tokens >= 32768 ? 200 : 2000;
    t = malloc(iters * sizeof(double));
    if (t == NULL) {
        exit(1);
    }

    for (i = 0; i < iters + 10; i++) {
        t0 = (bench_now_ns() / 1e3);

        /* as the module does: hashed while scanned, nothing written */
        if (kva_hash_body((uint8_t *) body, len, BLOCK_SIZE, NULL, hashes, &n,
                          &p)
            != KVA_PROMPT_OK)
        {
            fprintf(stderr, "body rejected\n");
            exit(1);
        }

        kva_index_match_found(ix, hashes, n, &mask, &clk, depth, found);

        for (k = 0; k < servers; k++) {
            cand[k].matched = depth[k];
        }

        k = kva_score_pick(&conf, cand, servers, n, (uint32_t) i, &why);
        kva_index_add_found(ix, hashes, n, k, KVA_BIT_LEARNED, &clk, found);

        if (i >= 10) {
            t[i - 10] = (bench_now_ns() / 1e3) - t0;
        }
    }

    qsort(t, iters, sizeof(double), bench_cmp_double);
    med = t[iters / 2];
    p99 = t[iters * 99 / 100];

    printf("| %6zuk | %-7s | %4u | %5s | %7zu | %8.1f | %8.1f | %6.0f | %s |\n",
           tokens / 1024, escapes ? "escapes" : "plain", servers,
           entries >= 1000000 ? "1M" : "10k", n, med, p99, budget,
           med <= budget ? "ok" : "OVER");

    free(t);
    free(region);
    free(found);
    free(hashes);
    free(body);
}


/*
 * Bytes per (block, holder), 1M blocks each held by 2 of the 1,024 slots,
 * and the ingest as events bring it: messages of 64 hashes, stored then
 * removed, a slot each.
 */
static void
index_bytes(void)
{
    void         *region;
    size_t        size;
    double        t0, t_add, t_del;
    uint32_t      j, i, cap;
    uint64_t      s, *keys;
    kva_clock_t   clk = { 100, 1u << 30, 100, {{ 0 }} };
    kva_index_t  *ix;

    cap = 1u << 20;
    size = kva_index_region_size(cap);
    region = malloc(size);
    keys = malloc(cap * sizeof(uint64_t));
    ix = region ? kva_index_init(region, size, 0x9e3779b97f4a7c15ULL) : NULL;

    if (ix == NULL || keys == NULL) {
        exit(1);
    }

    s = 11;

    for (i = 0; i < cap; i++) {
        keys[i] = kva_rand_next(&s);
    }

    t0 = bench_now_ns();

    for (j = 0; j < cap; j += 64) {
        kva_index_add(ix, keys + j, 64, (j / 64) % KVA_MAX_SLOTS,
                      KVA_BIT_EVENT, &clk);
        kva_index_add(ix, keys + j, 64, (j / 64 + 517) % KVA_MAX_SLOTS,
                      KVA_BIT_EVENT, &clk);
    }

    t_add = bench_now_ns() - t0;

    printf("index: %u blocks held by 2 of %u slots each, %u wide records: "
           "%.1f bytes per (block, holder)\n", ix->used, KVA_MAX_SLOTS,
           ix->wide_used, (double) size / (2.0 * ix->used));

    t0 = bench_now_ns();

    for (j = 0; j < cap; j += 64) {
        kva_index_del(ix, keys + j, 64, (j / 64) % KVA_MAX_SLOTS,
                      KVA_BIT_EVENT);
        kva_index_del(ix, keys + j, 64, (j / 64 + 517) % KVA_MAX_SLOTS,
                      KVA_BIT_EVENT);
    }

    t_del = bench_now_ns() - t0;

    printf("ingest over %u slots, 64 hashes a message: stored %.2fM "
           "hashes/s, removed %.2fM hashes/s (%u entries left)\n\n",
           KVA_MAX_SLOTS, 2.0 * cap / t_add * 1e3, 2.0 * cap / t_del * 1e3,
           ix->used);

    free(keys);
    free(region);
}


int
main(void)
{
    size_t    tokens[] = { 1024, 8192, 32768, 131072 };
    double    budget[] = { 10, 40, 150, 600 };
    unsigned  ti, esc, srv, ent;
    unsigned  servers[] = { 8, 64, 1024 };
    uint32_t  entries[] = { 10000, 1000000 };

    index_bytes();

    printf("routing cost per request (parse + hash + lookup + score + "
           "record), microseconds\n\n");
    printf("| tokens  | body    | servers | index | blocks | median | p99 "
           "| budget | |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");

    for (ti = 0; ti < 4; ti++) {
        for (esc = 0; esc < 2; esc++) {
            for (srv = 0; srv < 3; srv++) {
                for (ent = 0; ent < 2; ent++) {
                    run_case(tokens[ti], esc, servers[srv], entries[ent],
                             budget[ti]);
                }
            }
        }
    }

    return 0;
}
