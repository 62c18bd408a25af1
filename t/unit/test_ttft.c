/*
 * Unit tests of the prefill rate estimate and the time to first token
 * (src/core/kva_ttft.c): convergence, outliers clipped, the pool's
 * median as the prior, bad samples refused.
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tap.h"
#include "kva_ttft.h"


static int
near(double a, double b, double tol)
{
    return fabs(a - b) <= tol * (fabs(b) > 1.0 ? fabs(b) : 1.0);
}


/* kva_ttft_pool() against the median of a sorted copy */
static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static int
pool_agrees(void)
{
    static double  a[1024], b[1024];
    double         want, got;
    unsigned       n, i, shape;
    unsigned long  seed = 7;

    for (shape = 0; shape < 4; shape++) {
        for (n = 1; n <= 1024; n += (n < 40 ? 1 : 97)) {
            for (i = 0; i < n; i++) {
                seed = seed * 6364136223846793005UL + 1442695040888963407UL;
                a[i] = shape == 0 ? (double) (seed >> 40)
                     : shape == 1 ? (double) i
                     : shape == 2 ? (double) (n - i)
                     : (double) ((seed >> 40) % 5);
                b[i] = a[i];
            }

            qsort(b, n, sizeof(double), cmp_double);
            want = (n & 1) ? b[n / 2] : (b[n / 2 - 1] + b[n / 2]) / 2.0;
            got = kva_ttft_pool(a, n, 0);

            if (got != want) {
                printf("# n %u shape %u: %g, a sort says %g\n", n, shape, got,
                       want);
                return 0;
            }
        }
    }

    return 1;
}


/*
 * A server computing 0.5 blocks a ms in order, prompts of 10 and 30
 * blocks arriving every 50 ms: busy 80% of the time, a queue behind most
 * answers.  Timing each answer from its arrival with the blocks queued
 * ahead of it counted (the estimate before kva_ttft_answer()) takes the
 * prompts it is part way through as whole, and says about 1.5x.
 */
static int
fifo_rate(void)
{
    int         i;
    double      busy_until, arrive, finish, work;
    kva_ttft_t  t = { 0 };

    busy_until = 0;

    for (i = 0; i < 400; i++) {
        arrive = 1000.0 + 50.0 * i;
        work = (i & 1) ? 30.0 : 10.0;
        finish = (arrive > busy_until ? arrive : busy_until) + work / 0.5;
        busy_until = finish;

        (void) kva_ttft_answer(&t, work, (uint64_t) arrive,
                               (uint64_t) finish, 1000);
    }

    printf("# learned %g blocks a second, the server's 500\n", t.rate);

    return near(t.rate, 500.0, 0.03);
}


static int
answer_edges(void)
{
    double      w, ms;
    kva_ttft_t  t = { 0 };

    /* idle: from the try's start, learned at once: 10 blocks in 20 ms */
    if (kva_ttft_answer(&t, 10, 100, 120, 1000) != 1 || t.samples != 1
        || !near(t.rate, 500.0, 0.001))
    {
        return 0;
    }

    /* the same step: its blocks join that sample, 20 in 20 ms */
    if (kva_ttft_answer(&t, 10, 110, 121, 1000) != 1 || t.samples != 2
        || !near(t.rate, 1000.0, 0.001))
    {
        printf("# %g\n", t.rate);
        return 0;
    }

    /*
     * begun before the last answer: from it, 10 in 20 ms, weight 1/2 (the
     * second sample: the step before is one, its blocks summed)
     */
    w = 20.0 + (10.0 - 20.0) / 2;
    ms = 20.0;

    if (kva_ttft_answer(&t, 10, 115, 141, 1000) != 1 || t.samples != 3
        || !near(t.rate, w * 1000.0 / ms, 0.001))
    {
        printf("# %g\n", t.rate);
        return 0;
    }

    /* no work: teaches nothing, but opens a step from 141 */
    if (kva_ttft_answer(&t, 0, 130, 150, 1000) != 0 || t.samples != 3
        || t.last != 150)
    {
        return 0;
    }

    /*
     * a clock behind (another worker's) counts as the last answer's, and
     * so joins that step: 10 in 9 ms, weight 1/3
     */
    w += (10.0 - w) / 3;
    ms += (9.0 - ms) / 3;

    return kva_ttft_answer(&t, 10, 100, 149, 1000) == 1 && t.last == 150
           && t.samples == 4 && near(t.rate, w * 1000.0 / ms, 0.001);
}


/*
 * A server at 500 blocks a second prefilling two prompts, first and
 * second blocks, in one step of (first + second) / 0.5 ms, their first
 * tokens 1 ms apart, idle for 100 ms from each step's start.
 */
static int
two_a_step(double first, double second, int steps, const char *what)
{
    int         i;
    uint64_t    t0, ms;
    kva_ttft_t  t = { 0 };

    ms = (uint64_t) ((first + second) / 0.5);

    for (i = 0; i < steps; i++) {
        t0 = 1000 + 100 * (uint64_t) i;
        (void) kva_ttft_answer(&t, first, t0, t0 + ms, 1000);
        (void) kva_ttft_answer(&t, second, t0, t0 + ms + 1, 1000);
    }

    printf("# %s: learned %g blocks a second, the server's 500\n", what,
           t.rate);

    return near(t.rate, 500.0, 0.03);
}


/*
 * The first 32 samples are a plain mean: steps of four answers (25, 5, 5
 * and 5 blocks, none clipped), the first at 1,000 blocks a second, seven
 * at 500, weigh one each (a step's blocks are summed in it already), so
 * the rate is 8 * 40 blocks over 40 + 7 * 80 ms, not the first step's
 * weight grown by its answers.
 */
static int
steps_mean(void)
{
    int         i, k;
    uint64_t    t0, ms;
    kva_ttft_t  t = { 0 };

    for (i = 0; i < 8; i++) {
        t0 = 1000 + 1000 * (uint64_t) i;
        ms = i == 0 ? 40 : 80;

        for (k = 0; k < 4; k++) {
            (void) kva_ttft_answer(&t, k == 0 ? 25 : 5, t0, t0 + ms + (k > 0),
                                   1000);
        }
    }

    printf("# steps: learned %g blocks a second, the mean's %g\n", t.rate,
           320.0 * 1000.0 / (40.0 + 7 * 80.0));

    return t.samples == 32
           && near(t.rate, 320.0 * 1000.0 / (40.0 + 7 * 80.0), 0.001);
}


/*
 * A clock far behind the last first token's (a 32-bit ngx_msec_t that
 * wrapped): not taken as late, or every answer after would join the last
 * step, which never closes.
 */
static int
clock_reset(void)
{
    kva_ttft_t  t = { 0 };

    (void) kva_ttft_answer(&t, 10, 4294967000ULL, 4294967020ULL, 1000);

    if (kva_ttft_answer(&t, 10, 4294967010ULL, 30, 1000) != 0) {
        return 0;
    }

    return kva_ttft_answer(&t, 10, 100, 120, 1000) == 1 && t.last == 120
           && t.samples == 2 && near(t.rate, 500.0, 0.001);
}


int
main(void)
{
    int         i;
    double      rates[5];
    kva_ttft_t  t = { 0 };

    ok(!kva_ttft_learned(&t), "nothing learned at first");
    ok(kva_ttft_rate(&t, 700.0) == 700.0, "so the pool's rate predicts");

    ok(kva_ttft_learn(&t, 0, 10, 1000) == 0 && t.samples == 0,
       "a sample without work teaches nothing");
    ok(kva_ttft_learn(&t, 10, 0, 1000) == 0 && t.samples == 0,
       "nor one without time");
    ok(kva_ttft_learn(&t, NAN, 5, 1000) == 0 && t.samples == 0,
       "nor a NaN");

    /* 100 blocks in 1 ms: 100,000 a second, clipped to 4x the prior */
    ok(kva_ttft_learn(&t, 100, 1, 1000) == 1 && t.rate == 4000.0,
       "a first sample is clipped to 4x the prior (%g)", t.rate);

    /* a server at 250 blocks a second: the average follows */
    for (i = 0; i < 200; i++) {
        (void) kva_ttft_learn(&t, 25, 100, 1000);
    }

    ok(near(t.rate, 250.0, 0.02), "converges on 250 a second (%g)", t.rate);
    ok(kva_ttft_learned(&t) && kva_ttft_rate(&t, 700) == t.rate,
       "and then predicts by its own rate");

    /* one absurd answer of the usual work: 3/8 up at most, 1/4 down */
    (void) kva_ttft_learn(&t, 25, 1, 0);
    ok(t.rate <= 250.0 * 1.4, "a fast outlier moves it little (%g)",
       t.rate);

    for (i = 0; i < 200; i++) {
        (void) kva_ttft_learn(&t, 25, 100, 1000);
    }

    (void) kva_ttft_learn(&t, 25, 100000, 0);
    ok(t.rate >= 250.0 * 0.7, "a slow one too (%g)", t.rate);

    for (i = 0; i < 200; i++) {
        (void) kva_ttft_learn(&t, 25, 100, 1000);
    }

    ok(near(t.rate, 250.0, 0.02), "and is forgotten (%g)", t.rate);

    /*
     * A server that holds most prompts: 9 answers of 2 blocks in 20 ms
     * (its fixed latency, mostly), 1 of 600 in 600 ms.  An average of
     * the answers' rates would say 190 a second; the work's is near 800.
     */
    t.samples = 0;

    for (i = 0; i < 200; i++) {
        if (i % 10 == 9) {
            (void) kva_ttft_learn(&t, 600, 600, 1000);
        } else {
            (void) kva_ttft_learn(&t, 2, 20, 1000);
        }
    }

    ok(t.rate > 500, "answers weigh by their work (%g)", t.rate);

    ok(kva_ttft_speed(1200, 1000) == 1.0 && kva_ttft_speed(850, 1000) == 1.0,
       "a rate within a quarter of the pool's is the pool's speed");
    ok(kva_ttft_speed(500, 1000) == 0.5 && kva_ttft_speed(2000, 1000) == 2.0,
       "half and double are what they are");
    ok(kva_ttft_speed(0, 1000) == 1.0 && kva_ttft_speed(NAN, 0) == 1.0,
       "no rate or no pool: the pool's speed");

    ok(fifo_rate(), "a busy server is learned at its rate, not faster");
    ok(answer_edges(), "an answer's time starts at the previous answer");

    /*
     * timed alone, the second answer of a step would teach 10 blocks in
     * 1 ms, clipped, and the first 10 in 40 ms; together, 20 in 40 ms
     */
    ok(two_a_step(10, 10, 100, "batched"),
       "the answers of one step are learned together");

    /*
     * a small first answer (a prompt mostly cached) is clipped: its time
     * made the clip's must not be what the step's other blocks are
     * counted over, or each step is learned at 4x the rate it updates
     */
    ok(two_a_step(1, 19, 400, "small first"),
       "a step's small first answer does not time the step");
    ok(steps_mean(), "the first samples' mean weighs a step as one");
    ok(clock_reset(), "a clock far behind starts afresh");

    ok(kva_ttft_pool(rates, 0, 0) == KVA_TTFT_RATE_DEFAULT,
       "an empty pool: the default prior");
    ok(kva_ttft_pool(rates, 0, 1500) == 1500, "or the configured one");

    rates[0] = 900; rates[1] = 100; rates[2] = 500;
    ok(kva_ttft_pool(rates, 3, 1500) == 500, "the median of three");

    rates[0] = 900; rates[1] = 100; rates[2] = 500; rates[3] = 300;
    ok(kva_ttft_pool(rates, 4, 1500) == 400, "the median of four");

    ok(pool_agrees(), "the median of 1 to 1,024 rates, random, sorted, "
       "reversed and with repeats, as a sort finds it");

    ok(kva_ttft_predict(30, 20, 500) == 100.0,
       "50 blocks at 500 a second: 100 ms");
    ok(kva_ttft_predict(-5, 20, 500) == 40.0, "a negative queue is none");
    ok(kva_ttft_predict(0, 10, 0) == 10.0,
       "no rate: the default's (1000 a second)");

    return done_testing();
}
