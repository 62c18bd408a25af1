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

/* the weight of a new sample in the moving average */
#define KVA_TTFT_ALPHA          0.125


/*
 * One server's (rank's) estimate, kept by the caller (nginx: in the
 * shared zone, under its lock).  All zero: nothing learned.
 */
typedef struct {
    double              work;             /* blocks, averaged */
    double              ms;               /* and the time they took */
    double              rate;             /* work / ms, blocks a second */
    uint64_t            samples;
} kva_ttft_t;


/*
 * Learns from one answer: work blocks (the uncached blocks routed there
 * before it and not answered yet, and its own) took ms to the first
 * token.  The rate of the sample, work / ms, is clipped to within
 * KVA_TTFT_CLIP of the rate it updates (the server's own once it has
 * one, else ref, the pool's), its time made the clipped rate's; work
 * and time are each averaged in with weight KVA_TTFT_ALPHA, and the rate
 * is their ratio (the first sample is taken as it is, clipped).  Returns
 * 0 and learns nothing from a sample without work or time.
 */
int kva_ttft_learn(kva_ttft_t *t, double work, double ms, double ref);

/* whether t's own rate is trusted: KVA_TTFT_MIN_SAMPLES samples or more */
int kva_ttft_learned(const kva_ttft_t *t);

/*
 * The pool's rate, the prior of a server not learned yet: the median of
 * the n learned rates (sorted in place); with none, prior (the
 * configured one; 0: KVA_TTFT_RATE_DEFAULT).
 */
double kva_ttft_pool(double *rate, unsigned n, double prior);

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
