/*
 * Unit tests of the routing decision (src/core/kva_score.c).
 */

#include <string.h>

#include "tap.h"
#include "kva_score.h"


static void test_capacity(void);
static void test_fill(void);
static void test_overloaded(void);
static void test_speed(void);
static void test_tiers(void);
static void equal_servers(kva_candidate_t *c, unsigned n, double fill);


int
main(void)
{
    unsigned          i, best, counts[4];
    kva_why_e         why;
    kva_candidate_t   c[4];
    kva_score_conf_t  conf = { 2.0, 4, 1.5, 0.0, KVA_COST_LOAD,
                                 { 0.25, 0.5 } };

    equal_servers(c, 4, 0);

    /* all equal: the least routed wins, ties spread by rnd */
    c[0].routed = 3; c[1].routed = 2; c[2].routed = 2; c[3].routed = 5;
    memset(counts, 0, sizeof(counts));

    for (i = 0; i < 1000; i++) {
        counts[kva_score_pick(&conf, c, 4, 10, i * 2654435761u, &why)]++;
    }

    ok(counts[0] == 0 && counts[3] == 0, "only the least routed are picked");
    ok(counts[1] > 400 && counts[2] > 400, "ties split at random (%u/%u)",
       counts[1], counts[2]);
    ok(why == KVA_WHY_LOAD, "no overlap: reason is load");

    /* overlap wins over a small load difference */
    equal_servers(c, 4, 0);

    c[2].matched = 8;
    c[2].inflight_reqs = 1;
    c[2].inflight_blocks = 2;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best == 2 && why == KVA_WHY_AFFINITY, "affinity: the holder wins");

    /* enough load outweighs the overlap: 2*8 = 16 blocks saved */
    c[2].inflight_blocks = 20;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best != 2 && why == KVA_WHY_LOAD, "load outweighs overlap");

    /* the gate: the holder is far busier in requests than the idlest */
    conf.overlap_weight = 1000;
    c[2].inflight_blocks = 0;
    c[2].inflight_reqs = 4;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best == 2 && why == KVA_WHY_AFFINITY, "gate holds at the threshold");

    c[2].inflight_reqs = 5;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best != 2 && why == KVA_WHY_GATE, "gate trips past the threshold");

    conf.imbalance = 0;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best == 2, "imbalance=0 turns the gate off");

    /* the ratio half of the gate */
    conf.imbalance = 4;
    for (i = 0; i < 4; i++) {
        c[i].inflight_reqs = 10;
    }
    c[2].inflight_reqs = 15;
    best = kva_score_pick(&conf, c, 4, 10, 0, &why);
    ok(best == 2, "15 vs 10 is under ratio 1.5: the gate holds");

    /* weights scale load like least_conn does */
    memset(c, 0, sizeof(c));
    conf.overlap_weight = 2;
    c[0].weight = 1;  c[0].inflight_reqs = 2;
    c[1].weight = 3;  c[1].inflight_reqs = 4;
    best = kva_score_pick(&conf, c, 2, 0, 0, &why);
    ok(best == 1, "a heavier server takes more load");

    ok(strcmp(kva_score_why(KVA_WHY_GATE), "gate") == 0, "why names");
    ok(strcmp(kva_score_why(KVA_WHY_CAPACITY), "capacity") == 0,
       "why names: capacity");

    test_capacity();
    test_fill();

    test_overloaded();
    test_speed();
    test_tiers();

    return done_testing();
}


/*
 * A new conversation: 16 of 48 blocks (a shared system prompt) held by
 * server 0 only, which already holds other conversations.  Below
 * affinity_min the match does not draw it; at or above it, it does.
 */
static void
test_capacity(void)
{
    double            cost[4];
    unsigned          i, best, counts[4];
    kva_why_e         why;
    kva_candidate_t   c[4];
    kva_score_conf_t  conf = { 16.0, 32, 1.5, 0.5, KVA_COST_LOAD,
                                 { 0.25, 0.5 } };

    memset(c, 0, sizeof(c));

    for (i = 0; i < 4; i++) {
        c[i].weight = 1;
        c[i].fill = 100.0 * (i + 1);
    }

    c[0].matched = 16;
    c[0].fill = 5000;

    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 1 && why == KVA_WHY_CAPACITY,
       "16 of 48 held: the emptiest cache wins, reason capacity (%u)", best);

    conf.affinity_min = 0;
    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 0 && why == KVA_WHY_AFFINITY,
       "affinity_min=0: the holder wins as before");

    /* a later turn: 40 of 48 held, the full server keeps it */
    conf.affinity_min = 0.5;
    c[0].matched = 40;
    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 0 && why == KVA_WHY_AFFINITY,
       "40 of 48 held: the conversation stays, whatever the fill");

    /* exactly at the threshold counts as affinity */
    c[0].matched = 24;
    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 0 && why == KVA_WHY_AFFINITY, "24 of 48 at 0.5: affinity");

    /* nothing held anywhere: load as before, fill does not enter */
    c[0].matched = 0;
    c[3].fill = 0;
    c[1].inflight_reqs = 0;
    c[0].inflight_reqs = 1; c[2].inflight_reqs = 1; c[3].inflight_reqs = 1;
    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 1 && why == KVA_WHY_LOAD, "no match: by load, reason load");

    /* in-flight load counts in blocks next to the fill */
    for (i = 0; i < 4; i++) {
        c[i].fill = 1000;
        c[i].inflight_reqs = 0;
    }

    c[0].matched = 4;
    c[2].inflight_reqs = 1;
    c[2].inflight_blocks = 30;
    c[1].fill = 990;
    c[1].inflight_reqs = 1;
    c[1].inflight_blocks = 20;
    best = kva_score_pick(&conf, c, 4, 48, 0, &why);
    ok(best == 0 || best == 3, "fill + load: an idle server of equal fill "
       "beats one 10 blocks emptier but 21 busier (%u)", best);

    /* weight: a server twice as heavy holds twice the fill for equal cost */
    memset(c, 0, sizeof(c));
    c[0].weight = 2; c[0].fill = 1500; c[0].matched = 2;
    c[1].weight = 1; c[1].fill = 1000;
    best = kva_score_pick(&conf, c, 2, 48, 0, &why);
    ok(best == 0 && why == KVA_WHY_CAPACITY,
       "weight=2 with 1500 blocks is emptier than weight=1 with 1000");

    /*
     * A turn that mostly adds (a long tool output after 323 blocks of
     * context): under affinity_min, yet what home holds is taken off its
     * fill, as it need not store those blocks again; it stays home unless
     * another server's cache is emptier by more than that.
     */
    equal_servers(c, 4, 1300);

    c[0].matched = 323;
    c[0].fill = 1500;
    best = kva_score_pick(&conf, c, 4, 1106, 0, &why);
    ok(best == 0 && why == KVA_WHY_CAPACITY,
       "323 of 1106 held, home 200 blocks fuller: home, reason capacity "
       "(%u)", best);

    c[3].fill = 1100;
    best = kva_score_pick(&conf, c, 4, 1106, 0, &why);
    ok(best == 3 && why == KVA_WHY_CAPACITY,
       "another server 400 blocks emptier: there (%u)", best);

    /* 300 of home's blocks on disk (half a miss each): 173 held, not 323 */
    c[3].fill = 1300;
    c[2].fill = 1250;
    best = kva_score_pick(&conf, c, 4, 1106, 0, &why);
    ok(best == 0, "a server 250 blocks emptier than home: home (%u)", best);
    c[0].slow = 150;
    best = kva_score_pick(&conf, c, 4, 1106, 0, &why);
    ok(best == 2, "  with 300 of home's 323 on disk, there (%u)", best);
    c[0].slow = 0;

    /* ties of fill go to the least routed, then at random */
    memset(c, 0, sizeof(c));
    memset(counts, 0, sizeof(counts));

    for (i = 0; i < 4; i++) {
        c[i].weight = 1;
        c[i].routed = 7;
        c[i].matched = 3;
    }

    c[3].routed = 9;

    for (i = 0; i < 999; i++) {
        counts[kva_score_pick(&conf, c, 4, 48, i * 2654435761u, &why)]++;
    }

    ok(counts[3] == 0 && counts[0] > 250 && counts[1] > 250
       && counts[2] > 250, "empty caches: spread over the least routed "
       "(%u/%u/%u/%u)", counts[0], counts[1], counts[2], counts[3]);

    /*
     * A session's first request: a shared system prompt of 237
     * blocks that one server holds, with the few sessions it took, does
     * not draw the next; a session back home with its 1,000 blocks goes
     * home though home stored 500 more lately than another.
     */
    equal_servers(c, 4, 0);

    c[0].matched = 237;
    c[0].fill = 740;
    c[1].fill = 300;
    c[2].fill = 600;
    c[3].fill = 900;
    ok(kva_score_capacity(&conf, c, 4, 1000, 0, cost) == 1,
       "a new session: the server that stored least, not the holder of "
       "the shared prompt");

    c[0].matched = 1000;
    c[0].fill = 3000;
    c[1].matched = 237;
    c[1].fill = 2500;
    c[2].fill = c[3].fill = 2600;
    ok(kva_score_capacity(&conf, c, 4, 1000, 0, cost) == 0,
       "a session back: home, where 1,000 of its blocks are");
    c[0].matched = 300;
    ok(kva_score_capacity(&conf, c, 4, 1000, 0, cost) == 1,
       "with 300 of them, home fuller by 500: the emptiest");

    /*
     * A server holding more of the prompt than it stored lately (its fill
     * faded over learned_ttl, the shared prompt still held): the cost is
     * its fill once it stores the rest, never below zero, so a heavier or
     * a faster server is not made the costlier by the scaling.  Taking
     * the held blocks off the fill alone, fill 0 less 300 held was -300:
     * scaled by weight 3 it was -200 against -600 at weight 1, and over
     * speed 2 -150 against -600 at speed 0.5: the smaller or the slower
     * server won.
     */
    memset(c, 0, sizeof(c));
    c[0].weight = 3; c[0].matched = 300;
    c[1].weight = 1; c[1].matched = 300;
    best = kva_score_pick(&conf, c, 2, 1000, 0, &why);
    ok(best == 0 && why == KVA_WHY_CAPACITY,
       "300 of 1,000 held by both, fills faded: the heavier server (%u)",
       best);

    c[0].weight = c[1].weight = 1;
    c[0].speed = 2.0;
    c[1].speed = 0.5;
    conf.cost = KVA_COST_TTFT;
    best = kva_score_pick(&conf, c, 2, 1000, 0, &why);
    ok(best == 0 && why == KVA_WHY_CAPACITY,
       "cost=ttft, the same: the faster server (%u)", best);
    ok(kva_score_capacity(&conf, c, 2, 1000, 0, cost) == 0,
       "... and so for a session's first request");

    /*
     * The gate holds for capacity as for affinity: a holder of 400 of
     * 1,000 blocks (its credit) with 40 requests in flight, the others
     * idle, does not take it, as a holder of 500 would not.
     */
    equal_servers(c, 4, 1000);
    conf.cost = KVA_COST_LOAD;

    c[0].matched = 400;
    c[0].inflight_reqs = 40;
    c[0].inflight_blocks = 200;
    best = kva_score_pick(&conf, c, 4, 1000, 0, &why);
    ok(best != 0 && why == KVA_WHY_GATE, "400 of 1,000 held by a server "
       "40 requests busier: elsewhere, reason gate (%u, %s)", best,
       kva_score_why(why));
    c[0].matched = 500;
    best = kva_score_pick(&conf, c, 4, 1000, 0, &why);
    ok(best != 0 && why == KVA_WHY_GATE, "... as 500 of them (%u, %s)",
       best, kva_score_why(why));
    c[0].inflight_reqs = 20;
    c[0].matched = 400;
    best = kva_score_pick(&conf, c, 4, 1000, 0, &why);
    ok(best == 0 && why == KVA_WHY_CAPACITY, "20 busier, under the gate: "
       "the holder, reason capacity (%u, %s)", best, kva_score_why(why));
}


static void
test_fill(void)
{
    uint64_t    t;
    kva_fill_t  f;

    memset(&f, 0, sizeof(f));

    kva_fill_add(&f, 1000, 60000, 100);
    ok(kva_fill_get(&f, 1000, 60000) == 100.0, "fill: what was added");
    ok(kva_fill_get(&f, 31000, 60000) == 50.0, "fill: half gone at tau/2");
    ok(kva_fill_get(&f, 61000, 60000) == 0.0, "fill: all gone at tau");
    ok(kva_fill_get(&f, 500, 60000) == 100.0,
       "fill: a clock behind the update keeps all");

    kva_fill_add(&f, 31000, 60000, 10);
    ok(kva_fill_get(&f, 31000, 60000) == 60.0,
       "fill: adds to what is left");
    ok(kva_fill_get(&f, 1000000, 0) == 60.0, "fill: tau 0 keeps all");

    /* many small steps compound to about exp(-1) over tau */
    memset(&f, 0, sizeof(f));
    kva_fill_add(&f, 0, 60000, 1000);

    for (t = 600; t <= 60000; t += 600) {
        kva_fill_add(&f, t, 60000, 0);
    }

    ok(f.blocks > 360 && f.blocks < 370, "fill: frequent updates decay "
       "as exp(-t/tau) (%.1f of 1000 after tau)", f.blocks);
}


/* a session's server: overloaded by cost over the margin, or by the gate */
static void
test_overloaded(void)
{
    kva_candidate_t   c[3];
    kva_score_conf_t  conf = { 16.0, 4, 1.5, 0.5, KVA_COST_LOAD,
                                 { 0.25, 0.5 } };

    equal_servers(c, 3, 0);

    /* the bound one holds 8 of 10 blocks: 32 + its load, the others 160 */
    c[0].matched = 8;
    c[0].inflight_reqs = 2;
    c[0].inflight_blocks = 100;
    ok(!kva_score_overloaded(&conf, c, 3, 10, 0, 0.0),
       "its cache outweighs its load: not overloaded");

    c[0].inflight_blocks = 200;
    ok(kva_score_overloaded(&conf, c, 3, 10, 0, 0.0),
       "74 more than the least: overloaded at margin 0");
    ok(!kva_score_overloaded(&conf, c, 3, 10, 0, 100.0),
       "and not at margin 100");

    /* what capacity weighs, however much: not what a session's is by */
    c[0].inflight_blocks = 0;
    c[0].fill = 1e6;
    ok(!kva_score_overloaded(&conf, c, 3, 10, 0, 0.0),
       "what it stored lately does not count");

    /* the gate: 6 in flight over 1, more than 4 over and 1.5 times */
    c[0].inflight_reqs = 6;
    c[1].inflight_reqs = 1;
    c[2].inflight_reqs = 1;
    ok(kva_score_overloaded(&conf, c, 3, 10, 0, 1e9),
       "a hot spot by the gate's test, whatever the margin");
    conf.imbalance = 0;
    ok(!kva_score_overloaded(&conf, c, 3, 10, 0, 1e9),
       "imbalance=0: no gate");

    ok(!kva_score_overloaded(&conf, c, 3, 10, 3, 0.0),
       "a candidate out of range: not overloaded");
}


/*
 * Tiers: a prompt held in host memory costs a copy, a share of a miss:
 * less than a cold server's prefill, more than a GPU holder's nothing.
 */
static void
test_tiers(void)
{
    unsigned          best, cost;
    uint32_t          cpu[2] = { 40, 0 }, disk[2] = { 0, 40 };
    kva_why_e         why;
    kva_candidate_t   c[3];
    kva_score_conf_t  conf = { 16.0, 32, 1.5, 0.5, KVA_COST_LOAD,
                                 { 0.25, 0.5 } };

    ok(kva_score_slow(&conf, cpu) == 10.0 && kva_score_slow(&conf, disk)
       == 20.0, "40 blocks in host memory are 10 misses, on disk 20");

    for (cost = KVA_COST_LOAD; cost <= KVA_COST_TTFT; cost++) {
        conf.cost = cost;
        equal_servers(c, 3, 0);

        /* 0: the prompt in GPU memory, 1: in host memory, 2: cold */
        c[0].matched = 40;
        c[1].matched = 40;
        c[1].slow = kva_score_slow(&conf, cpu);

        best = kva_score_pick(&conf, c, 3, 40, 0, &why);
        ok(best == 0, "cost=%s: the GPU holder wins at equal load",
           cost ? "ttft" : "load");

        best = kva_score_pick(&conf, c + 1, 2, 40, 0, &why);
        ok(best == 0 && why == KVA_WHY_AFFINITY,
           "cost=%s: the host-memory holder beats a cold server",
           cost ? "ttft" : "load");

        /* 10 misses' worth: a load of 11 more makes the GPU one dearer */
        c[0].inflight_blocks = 11 * 16;
        best = kva_score_pick(&conf, c, 3, 40, 0, &why);
        ok(best == 1, "cost=%s: a busy GPU holder yields to the copy",
           cost ? "ttft" : "load");

        /* a bogus count past the match: never more than the match */
        c[0].inflight_blocks = 0;
        c[1].slow = 1e9;
        c[2].inflight_reqs = 1;
        best = kva_score_pick(&conf, c + 1, 2, 40, 0, &why);
        ok(best == 0, "cost=%s: slow past the match costs a cold prefill",
           cost ? "ttft" : "load");
    }
}


/* cost=ttft: each cost over the server's speed, its rate over the pool's */
static void
test_speed(void)
{
    unsigned          best;
    kva_why_e         why;
    kva_candidate_t   c[3];
    kva_score_conf_t  conf = { 16.0, 32, 1.5, 0.5, KVA_COST_LOAD,
                                 { 0.25, 0.5 } };

    equal_servers(c, 3, 0);

    /* no match anywhere: the slow one is the least loaded */
    c[0].speed = 0.5;
    c[1].inflight_blocks = 30;
    c[2].inflight_blocks = 30;
    best = kva_score_pick(&conf, c, 3, 10, 0, &why);
    ok(best == 0, "cost=load: the least loaded, however slow");

    conf.cost = KVA_COST_TTFT;
    best = kva_score_pick(&conf, c, 3, 10, 0, &why);
    ok(best != 0 && why == KVA_WHY_LOAD,
       "cost=ttft: 160 + 0 at half speed costs more than 160 + 30");

    /* a slow server's whole match still outweighs a little queue */
    c[0].matched = 10;
    best = kva_score_pick(&conf, c, 3, 10, 0, &why);
    ok(best == 0 && why == KVA_WHY_AFFINITY,
       "cost=ttft: the slow holder of the prompt keeps it");

    /* a session bound to the slow one: its cost over its speed */
    c[0].matched = 0;
    ok(kva_score_overloaded(&conf, c, 3, 10, 0, 100.0),
       "cost=ttft: 320 against 190 is over a margin of 100");
    conf.cost = KVA_COST_LOAD;
    ok(!kva_score_overloaded(&conf, c, 3, 10, 0, 100.0),
       "cost=load: 160 against 190 is not");
}


/* n servers alike: weight 1, the pool's speed, fill blocks stored lately */
static void
equal_servers(kva_candidate_t *c, unsigned n, double fill)
{
    unsigned  i;

    memset(c, 0, n * sizeof(kva_candidate_t));

    for (i = 0; i < n; i++) {
        c[i].weight = 1;
        c[i].speed = 1.0;
        c[i].fill = fill;
    }
}
