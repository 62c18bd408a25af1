/*
 * kv_aware core: the routing decision.
 */

#include "kva_score.h"
#include "kva_slotset.h"


#define KVA_COST_EPSILON  1e-9


static double kva_load(const kva_candidate_t *c, double mean_weight);
static double kva_misses(const kva_candidate_t *c, uint32_t nblocks);
static void kva_in_time(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, double *cost);
static unsigned kva_capacity(const kva_score_conf_t *conf,
    const kva_candidate_t *c, unsigned n, uint32_t nblocks,
    double mean_weight, uint32_t rnd, double *cost);
static unsigned kva_pick_min(const double *cost, const kva_candidate_t *c,
    unsigned n, uint32_t rnd);
static double kva_fill_kept(const kva_fill_t *f, uint64_t now, uint64_t tau);


const char  *const kva_why_names[] = {
    KVA_WHYS(KVA_LIST_NAME)
};


/* blocks to compute, a block in a slower tier as its share of one */
static double
kva_misses(const kva_candidate_t *c, uint32_t nblocks)
{
    double  slow;

    slow = c->slow < c->matched ? c->slow : c->matched;

    return (double) (nblocks - c->matched) + (slow > 0.0 ? slow : 0.0);
}


static double
kva_load(const kva_candidate_t *c, double mean_weight)
{
    return (double) (c->inflight_reqs + c->inflight_blocks)
           * mean_weight / c->weight;
}


/* cost=ttft: what a cost takes at the server's rate, against the pool's */
static void
kva_in_time(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, double *cost)
{
    unsigned  i;

    if (conf->cost != KVA_COST_TTFT) {
        return;
    }

    for (i = 0; i < n; i++) {
        if (c[i].speed > 0.0) {
            cost[i] /= c[i].speed;
        }
    }
}


/* lowest cost; ties go to the least routed, then to rnd */
static unsigned
kva_pick_min(const double *cost, const kva_candidate_t *c, unsigned n,
    uint32_t rnd)
{
    unsigned  i, ties, best;
    double    min;
    uint64_t  routed;

    min = cost[0];

    for (i = 1; i < n; i++) {
        if (cost[i] < min) {
            min = cost[i];
        }
    }

    routed = UINT64_MAX;

    for (i = 0; i < n; i++) {
        if (cost[i] <= min + KVA_COST_EPSILON && c[i].routed < routed) {
            routed = c[i].routed;
        }
    }

    ties = 0;
    best = 0;

    for (i = 0; i < n; i++) {
        if (cost[i] <= min + KVA_COST_EPSILON && c[i].routed == routed) {
            ties++;
        }
    }

    ties = rnd % ties;

    for (i = 0; i < n; i++) {
        if (cost[i] <= min + KVA_COST_EPSILON && c[i].routed == routed) {
            if (ties-- == 0) {
                best = i;
                break;
            }
        }
    }

    return best;
}


double
kva_score_slow(const kva_score_conf_t *conf, const uint32_t slow[2])
{
    return conf->tier_cost[0] * slow[0] + conf->tier_cost[1] * slow[1];
}


unsigned
kva_score_pick(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, uint32_t nblocks, uint32_t rnd, kva_why_e *why)
{
    double  cost[KVA_MAX_SLOTS];

    return kva_score_costs(conf, c, n, nblocks, rnd, cost, why);
}


unsigned
kva_score_costs(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, uint32_t nblocks, uint32_t rnd, double *cost, kva_why_e *why)
{
    double    mean_weight;
    unsigned  i, best;
    uint32_t  longest;
    uint64_t  least_reqs, total_weight;

    if (n > KVA_MAX_SLOTS) {
        n = KVA_MAX_SLOTS;
    }

    total_weight = 0;
    least_reqs = UINT64_MAX;
    longest = 0;

    for (i = 0; i < n; i++) {
        total_weight += c[i].weight;

        if (c[i].inflight_reqs < least_reqs) {
            least_reqs = c[i].inflight_reqs;
        }

        if (c[i].matched > longest) {
            longest = c[i].matched;
        }
    }

    mean_weight = (double) total_weight / n;

    /* a match of a small part: what it saves is less than where it goes */
    if (longest && longest < conf->affinity_min * nblocks) {
        best = kva_capacity(conf, c, n, nblocks, mean_weight, rnd, cost);
        *why = KVA_WHY_CAPACITY;

    } else {
        for (i = 0; i < n; i++) {
            cost[i] = conf->overlap_weight * kva_misses(&c[i], nblocks)
                      + kva_load(&c[i], mean_weight);
        }

        kva_in_time(conf, c, n, cost);
        best = kva_pick_min(cost, c, n, rnd);
        *why = c[best].matched ? KVA_WHY_AFFINITY : KVA_WHY_LOAD;
    }

    /*
     * The gate, for capacity too: what a server holds of the prompt is
     * taken off its fill there, so a small match draws as a large one
     * does (a holder of 400 of 1,000 blocks with 40 requests in flight
     * took the request from idle servers that a match of 500 would have
     * been sent to by the gate).
     */
    if (*why != KVA_WHY_LOAD
        && conf->imbalance
        && c[best].inflight_reqs > least_reqs + conf->imbalance
        && c[best].inflight_reqs > conf->imbalance_ratio * least_reqs)
    {
        for (i = 0; i < n; i++) {
            cost[i] = kva_load(&c[i], mean_weight);
        }

        kva_in_time(conf, c, n, cost);
        best = kva_pick_min(cost, c, n, rnd);
        *why = KVA_WHY_GATE;
    }

    return best;
}


unsigned
kva_score_capacity(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, uint32_t nblocks, uint32_t rnd, double *cost)
{
    unsigned  i;
    uint64_t  total_weight;

    if (n > KVA_MAX_SLOTS) {
        n = KVA_MAX_SLOTS;
    }

    total_weight = 0;

    for (i = 0; i < n; i++) {
        total_weight += c[i].weight;
    }

    return kva_capacity(conf, c, n, nblocks, (double) total_weight / n, rnd,
                        cost);
}


/* kva_score_capacity() once the candidates' mean weight is known */
static unsigned
kva_capacity(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, uint32_t nblocks, double mean_weight, uint32_t rnd,
    double *cost)
{
    unsigned  i;

    /*
     * The fill once the prompt is stored: what a server holds of it, it
     * need not store again.  Never below zero (matched <= nblocks), as a
     * fill less matched alone could be once the fill faded: scaled by
     * weight or divided by speed, the heavier or faster server was then
     * the costlier.  A block matched in host memory or on disk counts as
     * the share of a miss it is in the usual cost (kva_misses()): it is
     * copied back into GPU memory, where it takes room again.
     */
    for (i = 0; i < n; i++) {
        cost[i] = (c[i].fill + kva_misses(&c[i], nblocks))
                  * mean_weight / c[i].weight
                  + kva_load(&c[i], mean_weight);
    }

    kva_in_time(conf, c, n, cost);

    return kva_pick_min(cost, c, n, rnd);
}


int
kva_score_overloaded(const kva_score_conf_t *conf, const kva_candidate_t *c,
    unsigned n, uint32_t nblocks, unsigned bound, double margin)
{
    double    mean_weight, cost, least, mine;
    unsigned  i;
    uint64_t  least_reqs, total_weight;

    if (n > KVA_MAX_SLOTS) {
        n = KVA_MAX_SLOTS;
    }

    if (bound >= n) {
        return 0;
    }

    total_weight = 0;
    least_reqs = UINT64_MAX;

    for (i = 0; i < n; i++) {
        total_weight += c[i].weight;

        if (c[i].inflight_reqs < least_reqs) {
            least_reqs = c[i].inflight_reqs;
        }
    }

    if (conf->imbalance
        && c[bound].inflight_reqs > least_reqs + conf->imbalance
        && c[bound].inflight_reqs > conf->imbalance_ratio * least_reqs)
    {
        return 1;
    }

    mean_weight = (double) total_weight / n;
    least = 0.0;
    mine = 0.0;

    for (i = 0; i < n; i++) {
        cost = conf->overlap_weight * kva_misses(&c[i], nblocks)
               + kva_load(&c[i], mean_weight);

        if (conf->cost == KVA_COST_TTFT && c[i].speed > 0.0) {
            cost /= c[i].speed;
        }

        if (i == 0 || cost < least) {
            least = cost;
        }

        if (i == bound) {
            mine = cost;
        }
    }

    return mine > least + margin;
}


static double
kva_fill_kept(const kva_fill_t *f, uint64_t now, uint64_t tau)
{
    uint64_t  age;

    /* a clock that went back (another process's) keeps all */
    age = now > f->at ? now - f->at : 0;

    if (tau == 0) {
        return f->blocks;
    }

    return age >= tau ? 0.0 : f->blocks * (1.0 - (double) age / tau);
}


void
kva_fill_add(kva_fill_t *f, uint64_t now, uint64_t tau, double blocks)
{
    f->blocks = kva_fill_kept(f, now, tau) + blocks;

    if (now > f->at) {
        f->at = now;
    }
}


double
kva_fill_get(const kva_fill_t *f, uint64_t now, uint64_t tau)
{
    return kva_fill_kept(f, now, tau);
}


const char *
kva_score_why(kva_why_e why)
{
    return kva_why_names[(unsigned) why < KVA_WHY_LAST ? why : KVA_WHY_LOAD];
}
