/*
 * kv_aware core: weigh cache overlap against load and pick a server.
 */

#ifndef _KVA_SCORE_H_INCLUDED_
#define _KVA_SCORE_H_INCLUDED_


#include <stdint.h>


typedef struct {
    double              overlap_weight;   /* one block to recompute, in load */
    uint32_t            imbalance;        /* gate: in-flight request gap */
    double              imbalance_ratio;  /* gate: and this many times more */
} kva_score_conf_t;


typedef struct {
    uint32_t            matched;          /* leading prompt blocks held */
    uint32_t            weight;           /* nginx server weight, >= 1 */
    uint64_t            inflight_reqs;
    uint64_t            inflight_blocks;  /* blocks they had to compute */
    uint64_t            routed;           /* requests routed there so far */
} kva_candidate_t;


typedef enum {
    KVA_WHY_LOAD = 0,                     /* no server held any block */
    KVA_WHY_AFFINITY,                     /* chosen for the blocks it holds */
    KVA_WHY_GATE                          /* affinity overruled by the gate */
} kva_why_e;


/*
 * cost(c) = overlap_weight * (nblocks - matched) + load(c), where load is
 * the in-flight requests plus the blocks they had to compute, scaled by
 * the server's share of the total weight.  Lowest cost wins; among equals
 * the server that was routed the fewest requests, then rnd decides.
 *
 * The gate: if the winner has more than `imbalance` in-flight requests over
 * the least busy candidate and more than `imbalance_ratio` times as many,
 * the least loaded candidate wins instead.
 *
 * Returns the index of the chosen candidate; n must be >= 1.
 */
unsigned kva_score_pick(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks, uint32_t rnd,
    kva_why_e *why);

const char *kva_score_why(kva_why_e why);


#endif /* _KVA_SCORE_H_INCLUDED_ */
