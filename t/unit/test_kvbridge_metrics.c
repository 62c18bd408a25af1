/*
 * kvbridge's reading of an engine's load (tools/kvbridge/kvb_metrics.c):
 * the exposition parser on text shaped like vLLM's and SGLang's /metrics
 * (kvb_metrics_fixtures.h) and on hostile text, all series added up or
 * one data-parallel rank's alone.  The chunked decoder and the HTTP
 * client have tests of their own (test_kvbridge_chunked.c,
 * test_kvbridge_scrape.c).
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kvb_metrics.h"
#include "kvb_metrics_fixtures.h"


static int
parse(const char *s, kvb_load_t *load)
{
    return kvb_metrics_parse(s, strlen(s), load);
}


static void
test_parse_engines(void)
{
    kvb_load_t  l;

    ok(parse(kvb_fx_vllm_text, &l) == 0, "vLLM: parsed");
    ok(l.have_running && l.have_waiting && l.have_usage,
       "vLLM: all three found");
    ok(l.running == 12 && l.waiting == 3,
       "vLLM: two engines' counts added (running %u, waiting %u)",
       l.running, l.waiting);
    ok(l.kv_usage == 0.8125, "vLLM: usage is the fuller engine's (%g)",
       l.kv_usage);

    ok(parse(kvb_fx_vllm_old_text, &l) == 0 && l.have_usage && l.have_running
       && !l.have_waiting && l.kv_usage == 0.25 && l.running == 3,
       "older vLLM: gpu_cache_usage_perc read, waiting absent");

    ok(parse(kvb_fx_sglang_text, &l) == 0 && l.running == 60 && l.waiting == 4
       && l.kv_usage == 0.61,
       "SGLang, CRLF: running %u, waiting %u, usage %g",
       l.running, l.waiting, l.kv_usage);

    /* the text cut anywhere: never an error, never a read past len */
    {
        size_t    cut, n;
        unsigned  bad;
        char     *copy;

        n = strlen(kvb_fx_vllm_text);
        bad = 0;

        for (cut = 0; cut <= n; cut++) {
            /* a heap copy of exactly cut bytes: ASan sees an overread */
            copy = malloc(cut ? cut : 1);
            memcpy(copy, kvb_fx_vllm_text, cut);

            if (kvb_metrics_parse(copy, cut, &l) == 0
                && (l.kv_usage < 0 || l.kv_usage > 1
                    || l.running > 12 || l.waiting > 3))
            {
                bad++;
            }

            free(copy);
        }

        ok(bad == 0, "vLLM text cut at each of %zu bytes: sane loads", n);
    }
}


static void
test_parse_edges(void)
{
    char        *big;
    size_t       n;
    kvb_load_t   l;

    ok(parse("", &l) == -1 && !l.have_running && !l.have_usage,
       "empty text: -1");
    ok(parse("# HELP vllm:num_requests_running x\n"
             "# TYPE vllm:num_requests_running gauge\n", &l) == -1,
       "comments only: -1");
    ok(parse("foo 1\nbar{a=\"b\"} 2\n", &l) == -1, "other names: -1");
    ok(parse("\x01\xff garbage \n{}}}{\"\"\n\n\n", &l) == -1, "garbage: -1");

    ok(parse("vllm:num_requests_running 4", &l) == 0 && l.running == 4,
       "no labels, no trailing newline");
    ok(parse("  vllm:num_requests_running\t4 1700000000000\n", &l) == 0
       && l.running == 4, "leading blanks, tab, timestamp");
    ok(parse("vllm:num_requests_running{} 4\n", &l) == 0 && l.running == 4,
       "empty label set");
    ok(parse("vllm:num_requests_running{model_name=\"a\",} 4\n", &l) == 0
       && l.running == 4, "trailing comma in the labels");
    ok(parse("vllm:num_requests_running{model_name=\"a \\\"q\\\" "
             "\\\\ } 99 \\n{\",engine=\"0\"} 4\n", &l) == 0
       && l.running == 4,
       "label value with escaped quote, backslash, newline, brace");
    ok(parse("vllm:num_requests_running{model_name=\"a\\\"} 99\n", &l) == -1,
       "label value never closed: line skipped");
    ok(parse("vllm:num_requests_running{model_name=\"a\" 4\n", &l) == -1,
       "label set never closed: line skipped");
    ok(parse("vllm:num_requests_running{model_name=a} 4\n", &l) == -1,
       "unquoted label value: line skipped");

    ok(parse("vllm:num_requests_running_total 4\n"
             "vllm:num_requests_runningx 5\n"
             "xvllm:num_requests_running 6\n"
             "vllm:num_requests_running.5 7\n", &l) == -1,
       "names that only start or end like ours: skipped");

    ok(parse("vllm:kv_cache_usage_perc NaN\n", &l) == -1, "NaN ignored");
    ok(parse("vllm:kv_cache_usage_perc -0.5\n"
             "vllm:num_requests_waiting -3\n", &l) == -1,
       "negative values ignored");
    ok(parse("vllm:kv_cache_usage_perc +Inf\n", &l) == 0
       && l.kv_usage == 1.0, "usage +Inf clamped to 1");
    ok(parse("vllm:kv_cache_usage_perc 37.5\n", &l) == 0
       && l.kv_usage == 1.0, "usage given in percent clamped to 1");
    ok(parse("vllm:kv_cache_usage_perc 0\n"
             "vllm:kv_cache_usage_perc -Inf\n", &l) == 0
       && l.have_usage && l.kv_usage == 0, "usage 0 is found, -Inf not");
    ok(parse("vllm:kv_cache_usage_perc 5e-1\n", &l) == 0
       && l.kv_usage == 0.5, "exponent");
    ok(parse("vllm:num_requests_waiting 1e300\n"
             "vllm:num_requests_running +Inf\n", &l) == 0
       && l.waiting == UINT32_MAX && l.running == UINT32_MAX,
       "huge and infinite counts saturate");
    ok(parse("vllm:num_requests_waiting 4294967295\n"
             "vllm:num_requests_waiting 4294967295\n", &l) == 0
       && l.waiting == UINT32_MAX, "a sum past 2^32 saturates");
    ok(parse("vllm:num_requests_waiting 2.9999999\n", &l) == 0
       && l.waiting == 3, "a float count rounds");
    ok(parse("vllm:num_requests_waiting 1x\n"
             "vllm:num_requests_waiting 0x\n"
             "vllm:num_requests_waiting \n"
             "vllm:num_requests_waiting\n", &l) == -1,
       "bad or missing values: skipped");
    ok(parse("vllm:num_requests_waiting "
             "1.00000000000000000000000000000000000000000000000000000000000"
             "00000000000\n", &l) == -1,
       "value longer than 63 bytes: skipped");

    /* one line over the cap, a good one after it */
    n = KVB_METRICS_LINE_MAX + 100;
    big = malloc(n + 64);
    memcpy(big, "vllm:num_requests_waiting{a=\"", 29);
    memset(big + 29, 'x', n - 29);
    memcpy(big + n, "\"} 9\nvllm:num_requests_running 2\n", 33);

    ok(kvb_metrics_parse(big, n + 33, &l) == 0 && !l.have_waiting
       && l.running == 2, "a line over 64 KB skipped, the next read");

    /* NUL bytes inside, len not at a NUL */
    ok(kvb_metrics_parse("vllm:num_requests_waiting 1\n\0\0\n"
                         "vllm:num_requests_running 2\n",
                         31 + 28, &l) == 0
       && l.waiting == 1 && l.running == 2, "NUL bytes in the text");

    /* len stops mid-value: "12" read as "1" */
    ok(kvb_metrics_parse("vllm:num_requests_running 12\n", 27, &l) == 0
       && l.running == 1, "len honoured inside a value");

    free(big);
}


static void
test_parse_ranks(void)
{
    unsigned    r;
    kvb_load_t  all, rk[KVB_METRICS_RANKS];

    ok(kvb_metrics_parse_ranks(kvb_fx_vllm_text, strlen(kvb_fx_vllm_text),
                               &all, rk, 3) == 0
       && all.running == 12 && all.waiting == 3 && all.kv_usage == 0.8125,
       "vLLM, two engines: all of them added up, as without ranks");
    ok(rk[0].running == 7 && rk[0].waiting == 2 && rk[0].kv_usage == 0.4375
       && rk[0].have_running && rk[0].have_waiting && rk[0].have_usage,
       "vLLM engine=\"0\": rank 0's own (running %u, waiting %u, usage %g)",
       rk[0].running, rk[0].waiting, rk[0].kv_usage);
    ok(rk[1].running == 5 && rk[1].waiting == 1 && rk[1].kv_usage == 0.8125,
       "vLLM engine=\"1\": rank 1's own (running %u, waiting %u, usage %g)",
       rk[1].running, rk[1].waiting, rk[1].kv_usage);
    ok(!rk[2].have_running && !rk[2].have_waiting && !rk[2].have_usage
       && rk[2].running == 0, "a rank the engine lacks: nothing found");

    ok(kvb_metrics_parse_ranks(kvb_fx_sglang_text,
                               strlen(kvb_fx_sglang_text), &all, rk, 2) == 0
       && rk[0].running == 31 && rk[0].waiting == 4 && rk[0].kv_usage == 0.61
       && rk[1].running == 29 && rk[1].waiting == 0 && rk[1].kv_usage == 0.58
       && rk[1].have_waiting,
       "SGLang dp_rank=: each rank its own, a waiting of 0 found");

    ok(kvb_metrics_parse_ranks(kvb_fx_vllm_old_text,
                               strlen(kvb_fx_vllm_old_text), &all, rk, 2)
       == 0 && rk[0].running == 3 && rk[0].kv_usage == 0.25
       && !rk[1].have_running && !rk[1].have_usage,
       "no rank label (one engine): rank 0's");

    /* rank labels of every shape */
    {
        static const char  t[] =
            "vllm:num_requests_running{engine=\"63\"} 4\n"
            "vllm:num_requests_running{engine=\"64\"} 5\n"
            "vllm:num_requests_running{engine=\"07\"} 6\n"
            "vllm:num_requests_running{engine=\"x\"} 7\n"
            "vllm:num_requests_running{engine=\"\"} 8\n"
            "vllm:num_requests_running{dp_rank=\"1\","
            "engine_type=\"unified\"} 9\n";

        ok(kvb_metrics_parse_ranks(t, sizeof(t) - 1, &all, rk,
                                   KVB_METRICS_RANKS) == 0
           && all.running == 39 && rk[63].running == 4
           && rk[1].running == 9 && rk[0].running == 0
           && !rk[0].have_running,
           "engine=\"63\" is rank 63's; \"64\", \"07\", \"x\", \"\" no "
           "rank's (counted in all: %u)", all.running);
    }

    /* nranks past the cap: only the cap is written */
    memset(rk, 0xa5, sizeof(rk));
    ok(kvb_metrics_parse_ranks(kvb_fx_vllm_text, strlen(kvb_fx_vllm_text),
                               &all, rk, 1000) == 0 && rk[1].running == 5,
       "nranks past %d: capped", KVB_METRICS_RANKS);

    for (r = 2; r < KVB_METRICS_RANKS && !rk[r].have_running; r++) {
        /* void */
    }

    ok(r == KVB_METRICS_RANKS, "ranks without series stay empty");
}


/* the KV pool: vLLM's cache_config_info labels, SGLang's gauge */
static void
test_parse_pool(void)
{
    kvb_load_t   all, ranks[2];
    const char  *dp;

    dp = "vllm:cache_config_info{engine=\"0\",block_size=\"16\","
         "num_gpu_blocks=\"100\"} 1\n"
         "vllm:cache_config_info{engine=\"1\",block_size=\"16\","
         "num_gpu_blocks=\"300\"} 1\n";

    ok(parse("# TYPE vllm:cache_config_info gauge\n"
             "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
             "num_gpu_blocks=\"27000\",num_cpu_blocks=\"None\"} 1.0\n",
             &all) == 0
       && all.have_tokens && all.kv_tokens == 432000,
       "vLLM: 27000 blocks of 16 are 432000 tokens (%llu)",
       (unsigned long long) all.kv_tokens);

    ok(parse("vllm:cache_config_info{block_size=\"16\","
             "num_gpu_blocks=\"None\"} 1.0\n", &all) == -1
       && !all.have_tokens,
       "vLLM before profiling (num_gpu_blocks None): no pool");

    ok(parse("vllm:cache_config_info{block_size=\"16\"} 1.0\n"
             "vllm:cache_config_info{num_gpu_blocks=\"99999999999999\","
             "block_size=\"16\"} 1.0\n", &all) == -1,
       "a label missing, or a count past 2^40: no pool");

    ok(parse("sglang:max_total_num_tokens{model_name=\"m\"} 655360.0\n",
             &all) == 0 && all.kv_tokens == 655360,
       "SGLang: max_total_num_tokens");

    ok(kvb_metrics_parse_ranks(dp, strlen(dp), &all, ranks, 2) == 0
       && all.kv_tokens == 6400 && ranks[0].kv_tokens == 1600
       && ranks[1].kv_tokens == 4800,
       "data parallel: each rank its pool, the server their sum");
}


int
main(void)
{
    test_parse_engines();
    test_parse_edges();
    test_parse_ranks();
    test_parse_pool();

    return done_testing();
}
