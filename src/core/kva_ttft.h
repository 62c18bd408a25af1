/*
 * kv_aware core: a server's prefill rate, learned from the time to first
 * token nginx sees, and the time to first token it predicts.
 */

#ifndef _KVA_TTFT_H_INCLUDED_
#define _KVA_TTFT_H_INCLUDED_


#include <stdint.h>


/* the prior when no rate is learned and none configured: blocks a second */
#define KVA_TTFT_RATE_DEFAULT   1000.0

/* samples before a server's own rate is trusted over the pool's */
#define KVA_TTFT_MIN_SAMPLES    4

/* a sample is clipped to within this factor of the rate it updates */
#define KVA_TTFT_CLIP           4.0

/*
 * first tokens this close after a group's first are of the same step
 * (kva_ttft_answer())
 */
#define KVA_TTFT_BATCH_MS       2

/* a clock this far behind the last first token's is not late but reset */
#define KVA_TTFT_CLOCK_MS       60000

/*
 * a rate within this factor of the pool's is taken as the pool's
 * (kva_ttft_speed())
 */
#define KVA_TTFT_BAND           1.25

/*
 * the weight of a new sample in the moving average, once there are
 * 1 / KVA_TTFT_ALPHA of them (before: the plain mean of those seen)
 */
#define KVA_TTFT_ALPHA          (1.0 / 32)


/*
 * One server's (rank's) estimate, kept by the caller (nginx: in the
 * shared zone, under its lock).  All zero: nothing learned.
 */
typedef struct {
    double              work;             /* blocks, averaged */
    double              ms;               /* and the time they took */
    double              rate;             /* work / ms, blocks a second */
    uint64_t            samples;          /* answers learned from */
    uint64_t            steps;            /* samples averaged (steps) */
    /* the answers of one step, one sample (kva_ttft_answer()) */
    uint64_t            last;             /* ms, the last first token */
    uint64_t            group_from;       /* ms, the step's time began */
    uint64_t            group_first;      /* ms, its first answer's */
    double              group_work;       /* blocks, its answers' */
    double              group_span;       /* ms, its time when learned */
    double              group_ref;        /* the rate it was clipped to */
    double              group_ms;         /* its time in the averages */
    double              group_alpha;      /* its weight; 0: not learned */
    unsigned            group;            /* 1: one is open */
} kva_ttft_t;


/*
 * Learns from one answer: work blocks (the uncached blocks routed there
 * before it and not answered yet, and its own) took ms to the first
 * token.  The rate of the sample, work / ms, is clipped to within
 * KVA_TTFT_CLIP of the rate it updates (the server's own once it has
 * one, else ref, the pool's), its time made the clipped rate's; work
 * and time are each averaged in with weight KVA_TTFT_ALPHA (the plain
 * mean of the samples while there are fewer than 1 / KVA_TTFT_ALPHA),
 * and the rate
 * is their ratio (the first sample is taken as it is, clipped).  Returns
 * 0 and learns nothing from a sample without work or time.
 */
int kva_ttft_learn(kva_ttft_t *t, double work, double ms, double ref);

/*
 * An answer's first token at now, ms, its try begun at start, work its
 * own uncached blocks.  Its blocks took the time since the server's
 * previous first token, or since the try began if that is later (the
 * server was idle until then): one sample, learned with kva_ttft_learn()
 * at once.  Answers that come within KVA_TTFT_BATCH_MS of the first of a
 * group, their tries begun before the group's last answer, are of the
 * same step (an engine prefills several prompts in one step and they
 * answer together): their blocks are added to the group's sample where
 * it already is in the averages, with the weight it got, as far as the
 * clip allows.  Returns 1 when the averages changed.  A clock behind the
 * last answer's (another worker's) counts as the last's.
 *
 * Why not the blocks queued before the answer over the time since its try
 * began: the queue counts whole the prompts the server is already part
 * way through, so a busy server looked faster the more it was given, and
 * cost=ttft then gave it more still (docs/design.md).  Why the groups:
 * timed alone, the second answer of a step has no time of its own, and
 * the first's time would carry both answers' work.
 */
int kva_ttft_answer(kva_ttft_t *t, double work, uint64_t start,
    uint64_t now, double ref);

/* whether t's own rate is trusted: KVA_TTFT_MIN_SAMPLES samples or more */
int kva_ttft_learned(const kva_ttft_t *t);

/*
 * The pool's rate, the prior of a server not learned yet: the median of
 * the n learned rates (sorted in place); with none, prior (the
 * configured one; 0: KVA_TTFT_RATE_DEFAULT).
 */
double kva_ttft_pool(double *rate, unsigned n, double prior);

/*
 * A server's speed, what cost=ttft divides its cost by: its rate over the
 * pool's, 1 within KVA_TTFT_BAND of it.  Why the band: servers alike
 * learn rates that differ by about that much (the work nginx thinks an
 * answer had is what its index thought missing), and a cost that took
 * every such difference at its word would send more to whichever looked
 * fastest, each time it did.  A server at half speed is well outside.
 */
double kva_ttft_speed(double rate, double pool);

/* the rate a server is predicted by: its own, or the pool's */
double kva_ttft_rate(const kva_ttft_t *t, double pool);

/*
 * Time to first token, ms: the blocks routed there before and not
 * answered yet, this request's uncached blocks (a block held in a slower
 * tier counted as the fraction of a miss its caller weighs it), over the
 * rate.
 */
double kva_ttft_predict(double queued, double own, double rate);


#endif /* _KVA_TTFT_H_INCLUDED_ */
