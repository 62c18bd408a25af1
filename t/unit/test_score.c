/*
 * Unit tests of the routing decision (src/core/kva_score.c).
 */

#include <string.h>

#include "tap.h"
#include "kva_score.h"


int
main(void)
{
    unsigned          i, best, counts[4];
    kva_why_e         why;
    kva_candidate_t   c[4];
    kva_score_conf_t  conf = { 2.0, 4, 1.5 };

    memset(c, 0, sizeof(c));

    for (i = 0; i < 4; i++) {
        c[i].weight = 1;
    }

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
    memset(c, 0, sizeof(c));
    for (i = 0; i < 4; i++) {
        c[i].weight = 1;
    }

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

    return done_testing();
}
