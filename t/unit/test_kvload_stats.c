/*
 * Unit tests for kvload's statistics (tools/kvload/kvload_stats.c) on a
 * known trace.  Expected percentiles are numpy.percentile()'s (linear).
 * Prints TAP.
 */

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "kvload_stats.h"


#define near(a, b)  (fabs((a) - (b)) < 1e-9)


static void test_percentiles(void);
static void test_hit_rate(void);
static void test_backends(void);
static void test_summary(void);


int
main(void)
{
    test_percentiles();
    test_hit_rate();
    test_backends();
    test_summary();

    return done_testing();
}


static void
test_percentiles(void)
{
    int            i;
    kvl_samples_t  s;
    static double  trace[] = { 7, 1, 10, 3, 5, 2, 9, 4, 8, 6 };

    memset(&s, 0, sizeof(s));

    ok(kvl_percentile(&s, 50.0) == 0.0, "empty: 0");

    ok(kvl_samples_add(&s, 4.0) == 0, "add one");
    ok(kvl_percentile(&s, 50.0) == 4.0 && kvl_percentile(&s, 99.0) == 4.0,
       "one sample: every percentile is it");

    kvl_samples_free(&s);

    for (i = 0; i < 10; i++) {
        kvl_samples_add(&s, trace[i]);
    }

    ok(near(kvl_percentile(&s, 50.0), 5.5), "1..10 unsorted: p50 5.5");
    ok(near(kvl_percentile(&s, 90.0), 9.1), "p90 9.1");
    ok(near(kvl_percentile(&s, 99.0), 9.91), "p99 9.91");
    ok(kvl_percentile(&s, 0.0) == 1.0 && kvl_percentile(&s, 100.0) == 10.0,
       "p0 min, p100 max");

    /* adding after a query re-sorts */
    kvl_samples_add(&s, 0.5);
    ok(near(kvl_percentile(&s, 50.0), 5.0), "11 samples: p50 5");

    for (i = 0; i < 5000; i++) {
        if (kvl_samples_add(&s, 100.0) != 0) {
            break;
        }
    }

    ok(i == 5000 && s.n == 5011, "grows past its first allocation");
    ok(kvl_percentile(&s, 50.0) == 100.0, "p50 of the tail");

    kvl_samples_free(&s);
    ok(s.v == NULL && s.n == 0, "free resets");
}


static void
test_hit_rate(void)
{
    ok(kvl_hit_rate(0, 0) == 0.0, "no prompt tokens: 0");
    ok(near(kvl_hit_rate(900, 1200), 0.75), "900 of 1200 tokens: 0.75");

    /*
     * one 1000-token prompt 90% cached and two 100-token ones missed:
     * token-weighted 0.75, where a per-request mean would say 0.30
     */
    ok(near(kvl_hit_rate(900 + 0 + 0, 1000 + 100 + 100), 0.75),
       "token-weighted, not request-weighted");
}


static void
test_backends(void)
{
    int           i;
    char          name[32];
    kvl_stage_t   st;

    memset(&st, 0, sizeof(st));

    kvl_stage_backend(&st, "127.0.0.1:8001");
    kvl_stage_backend(&st, "127.0.0.1:8002");
    kvl_stage_backend(&st, "127.0.0.1:8001");
    kvl_stage_backend(&st, "");
    kvl_stage_backend(&st, NULL);

    ok(st.nbackends == 2, "two backends");
    ok(st.backends[0].requests == 2 && st.backends[1].requests == 1,
       "counted per backend");
    ok(st.backend_unknown == 2, "empty or missing name: unknown");

    for (i = 0; i < KVL_MAX_BACKENDS + 5; i++) {
        snprintf(name, sizeof(name), "b%d", i);
        kvl_stage_backend(&st, name);
    }

    ok(st.nbackends == KVL_MAX_BACKENDS, "table caps at %d",
       KVL_MAX_BACKENDS);
    ok(st.backend_unknown == 2 + 7, "overflow counted as unknown");
}


static void
test_summary(void)
{
    int            i;
    kvl_stage_t    st;
    kvl_summary_t  s;

    /*
     * a stage measured at time scale 10: 10 requests sent over 1 real
     * second (10 s uncompressed), TTFT 0.1 .. 1.0 real seconds, 500
     * tokens streamed while it lasted, 1000 for its requests in all
     */

    memset(&st, 0, sizeof(st));

    st.sent = 10;
    st.completed = 10;
    st.t_start = 100.0;
    st.t_arrivals_end = 101.0;
    st.output_tokens = 1000;
    st.window_tokens = 500;
    st.prompt_tokens = 1200;
    st.cached_tokens = 900;
    st.waiting_sum = 6.0;
    st.scrapes = 3;

    for (i = 1; i <= 10; i++) {
        kvl_samples_add(&st.ttft, i / 10.0);
        kvl_samples_add(&st.e2e, i / 10.0 + 1.0);
        kvl_samples_add(&st.itl, 0.001);
    }

    /* 99 gaps of one step, one stalled by a prefill in the batch */
    for (i = 0; i < 99; i++) {
        kvl_samples_add(&st.gap, 0.001);
    }

    kvl_samples_add(&st.gap, 0.101);

    kvl_stage_summarize(&st, 10.0, &s);

    ok(near(s.achieved_qps, 1.0), "achieved QPS uncompressed: 1.0");
    ok(near(s.ttft_p50, 5.5) && near(s.ttft_p90, 9.1)
       && near(s.ttft_p99, 9.91), "TTFT scaled back: 5.5 / 9.1 / 9.91 s");
    ok(near(s.e2e_p50, 15.5), "e2e p50 15.5 s");
    ok(near(s.itl_p50, 0.01), "ITL p50 10 ms");
    ok(near(s.gap_p50, 0.01) && near(s.gap_p99, 0.02),
       "token gaps: p50 10 ms, p99 interpolated toward the stall");
    ok(near(s.gen_tok_s, 50.0), "500 tokens over its 10 s: 50 tok/s");
    ok(near(s.hit_rate, 0.75), "hit rate 0.75");
    ok(near(s.waiting_mean, 2.0), "queue mean over scrapes");

    kvl_stage_summarize(&st, 1.0, &s);
    ok(near(s.ttft_p90, 0.91) && near(s.gen_tok_s, 500.0),
       "scale 1: figures as measured");

    kvl_stage_free(&st);

    memset(&st, 0, sizeof(st));
    kvl_stage_summarize(&st, 10.0, &s);
    ok(s.achieved_qps == 0.0 && s.ttft_p90 == 0.0 && s.gen_tok_s == 0.0
       && s.hit_rate == 0.0 && s.waiting_mean == 0.0,
       "empty stage: zeros, no division by zero");
}
