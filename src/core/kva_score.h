/*
 * kv_aware core: weigh cache overlap against load and pick a server.
 */

#ifndef _KVA_SCORE_H_INCLUDED_
#define _KVA_SCORE_H_INCLUDED_


#include <stdint.h>

#include "kva_list.h"


/* what a candidate costs (kva_score_conf_t.cost) */
#define KVA_COST_LOAD       0             /* overlap against load */
#define KVA_COST_TTFT       1             /* predicted time to first token */


typedef struct {
    double              overlap_weight;   /* one block to recompute, in load */
    uint32_t            imbalance;        /* gate: in-flight request gap */
    double              imbalance_ratio;  /* gate: and this many times more */
    double              affinity_min;     /* share of the prompt a match
                                             must cover; 0: any match */
    unsigned            cost;             /* KVA_COST_* */
    double              tier_cost[2];     /* a block in host memory, on
                                             disk: the share of a miss */
} kva_score_conf_t;


typedef struct {
    uint32_t            matched;          /* leading prompt blocks held */
    double              slow;             /* of those, the ones in slower
                                             tiers, as misses
                                             (kva_score_slow()) */
    uint32_t            weight;           /* nginx server weight, >= 1 */
    uint64_t            inflight_reqs;
    uint64_t            inflight_blocks;  /* blocks they had to compute */
    uint64_t            routed;           /* requests routed there so far */
    double              fill;             /* blocks it stored lately */
    double              speed;            /* prefill rate / the pool's */
    double              ttft;             /* predicted, ms (kva_ttft.h) */
} kva_candidate_t;


/*
 * How full a server's cache is, as the router counts: the blocks it was
 * sent to compute (and so to cache), fading out over tau, the time an idle
 * prefix is thought to survive there.  Kept by the caller (nginx: in the
 * shared zone, under its lock); the decay is linear between two updates,
 * which compounds to an exponential when they are frequent.
 */
typedef struct {
    double              blocks;
    uint64_t            at;               /* ms, of the last update */
} kva_fill_t;


/*
 * Why a server was chosen: no server held any block (load), for the
 * blocks it holds (affinity), affinity or capacity overruled by the gate
 * (gate), a small match placed by fill (capacity).  kva_why_names[] in
 * this order.
 */
#define KVA_WHYS(X)                                                           \
    X(KVA_WHY_LOAD, "load")                                                   \
    X(KVA_WHY_AFFINITY, "affinity")                                           \
    X(KVA_WHY_GATE, "gate")                                                   \
    X(KVA_WHY_CAPACITY, "capacity")

typedef enum {
    KVA_WHYS(KVA_LIST_ENUM)
    KVA_WHY_LAST
} kva_why_e;

extern const char  *const kva_why_names[];


/*
 * The misses that a candidate's matched blocks in slower tiers are worth:
 * each costs tier_cost of a miss (a copy back into GPU memory instead of
 * a prefill; docs/design.md), slow[0] in host memory, slow[1] on disk.
 */
double kva_score_slow(const kva_score_conf_t *conf, const uint32_t slow[2]);

/*
 * cost(c) = overlap_weight * (nblocks - matched + slow) + load(c), where
 * slow is the matched blocks in slower tiers, as misses; load is
 * the in-flight requests plus the blocks they had to compute, scaled by
 * the server's share of the total weight.  Lowest cost wins; among equals
 * the server that was routed the fewest requests, then rnd decides.
 *
 * The gate: if the winner (by affinity or by capacity) has more than
 * `imbalance` in-flight requests over the least busy candidate and more
 * than `imbalance_ratio` times as many, the least loaded candidate wins
 * instead.
 *
 * Capacity: when the longest match covers some of the prompt but less
 * than `affinity_min` of its blocks (a shared system prompt in front of a
 * new conversation), the match saves little and would draw every new
 * conversation to one server: cost(c) = fill + nblocks - matched + load,
 * scaled by weight, so the new prefix goes where the cache has the most
 * room once it is stored (what a server holds of it, it need not store
 * again; never below zero, so that weight and speed scale it rightly).
 * After SGLang's router (which balances by tree size below its
 * threshold).
 *
 * With cost KVA_COST_TTFT, each cost (whatever the mode) is divided by
 * c's speed, its prefill rate over the pool's: the time the work takes
 * there, in blocks at the pool's rate.  A server at half the pool's rate
 * costs double.  Its misses keep their overlap_weight: a miss costs more
 * than its own prefill (a second copy of the prefix, evicting others'),
 * so the request's own time to first token alone (c->ttft) is too
 * greedy a cost (docs/design.md).
 *
 * Returns the index of the chosen candidate; n must be >= 1.
 */
unsigned kva_score_pick(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks, uint32_t rnd,
    kva_why_e *why);

/*
 * The same, leaving in cost[0 .. n) the cost each candidate was weighed
 * by in the end (lower is better; a gated pick's are load alone), for a
 * ranking of all of them.
 */
unsigned kva_score_costs(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks, uint32_t rnd,
    double *cost, kva_why_e *why);

/*
 * Placement by capacity (step 5 of docs/design.md): fill + nblocks -
 * matched + load, scaled by weight, with the time to first token if
 * configured; cost[] as kva_score_costs() leaves it.  A block a server
 * holds of the prompt is one it need not store: a turn that mostly adds
 * (a long tool output) stays with its context, and a session back after
 * its binding expired goes home, unless home is fuller by more than what
 * it holds.
 */
unsigned kva_score_capacity(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks, uint32_t rnd,
    double *cost);

/*
 * Whether candidate bound (a server a session is bound to) is overloaded
 * against the others: the gate's test holds for it (more than imbalance
 * requests in flight over the least busy candidate and more than
 * imbalance_ratio times as many), or its cost, overlap_weight * blocks to
 * recompute (slow ones as misses) + load (with KVA_COST_TTFT: over its
 * speed), exceeds the least one's by more than margin.  That cost
 * whatever the mode of the choice: placing by capacity weighs what a
 * server stored lately, which a session's own server has the most of.
 */
int kva_score_overloaded(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks, unsigned bound,
    double margin);

/* now and tau in ms; tau 0: nothing fades */
void kva_fill_add(kva_fill_t *f, uint64_t now, uint64_t tau, double blocks);
double kva_fill_get(const kva_fill_t *f, uint64_t now, uint64_t tau);

const char *kva_score_why(kva_why_e why);


#endif /* _KVA_SCORE_H_INCLUDED_ */
