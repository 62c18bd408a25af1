/*
 * kv_aware core: the prefill rate of a server and its time to first
 * token.
 *
 * What an answer's time measures: a server prefills the prompts it has
 * in order, so between two first tokens it computed the second's
 * uncached blocks (kva_ttft_answer()).  An engine prefills several
 * prompts in one step, and their first tokens come together: the
 * answers of one step are one sample, their blocks summed over the time
 * since the answers before them.  Over a busy spell the intervals add up
 * to the spell and the blocks to its work, whatever the engine batched,
 * so the averages below see the server's rate under the load it had,
 * decodes sharing its steps included.
 *
 * Why moving averages of work and time, and their ratio: one answer's
 * rate is noisy (a step shared with decodes, a prompt that arrived as
 * another's prefill ended) and now and then absurd (a pause, a prompt
 * the index thought missing); a median over a window would need the
 * window kept per server in the shared zone.  The ratio of the sums
 * weighs each answer by its work: an answer with little to compute is
 * mostly the server's fixed latency (a step, the first decode), and an
 * average of per-answer rates would take a server that holds most
 * prompts (many such answers) for a slow one.  Clipping each answer's
 * rate to a factor of 4 of the current rate bounds what it moves.  The
 * averages are plain means of the first 32 samples (no weight left on
 * the first one, as an average from it would keep), then forget
 * geometrically, half the weight in 22 samples: a server's speed is its
 * hardware's and changes seldom, while one answer's interval varies with
 * what the server batched and how much nginx's index was wrong about;
 * with half the weight in 5 answers, servers alike learned rates 3x
 * apart under load.  A server that slows down is followed within about
 * a hundred answers.
 */

#include "kva_ttft.h"


static double kva_ttft_clip(double v, double ref);
static double kva_ttft_clipped_ms(double work, double ms, double ref);
static int kva_ttft_sample(kva_ttft_t *t, double work, double ms, double ref,
    double *alpha, double *clip_ref, double *clipped_ms);
static double kva_ttft_select(double *rate, unsigned n, unsigned k);


static double
kva_ttft_clip(double v, double ref)
{
    if (ref <= 0.0) {
        return v;
    }

    if (v > ref * KVA_TTFT_CLIP) {
        return ref * KVA_TTFT_CLIP;
    }

    if (v < ref / KVA_TTFT_CLIP) {
        return ref / KVA_TTFT_CLIP;
    }

    return v;
}


int
kva_ttft_learn(kva_ttft_t *t, double work, double ms, double ref)
{
    double  alpha, clip_ref, clipped_ms;

    return kva_ttft_sample(t, work, ms, ref, &alpha, &clip_ref, &clipped_ms);
}


/* the time work is taken to have taken: its rate clipped to ref's */
static double
kva_ttft_clipped_ms(double work, double ms, double ref)
{
    return work * 1000.0 / kva_ttft_clip(work * 1000.0 / ms, ref);
}


/*
 * One sample into the averages; *alpha is the weight it got (1: the
 * first), *clip_ref the rate it was clipped to within KVA_TTFT_CLIP of
 * (0: none), *clipped_ms the time it was averaged with: kva_ttft_answer()
 * redoes the sample with the rest of a step's blocks.  The weight counts
 * samples (steps), not answers: a step's blocks are summed in its work
 * already.
 */
static int
kva_ttft_sample(kva_ttft_t *t, double work, double ms, double ref,
    double *alpha, double *clip_ref, double *clipped_ms)
{
    /* NaN fails these too */
    if (!(work > 0.0) || !(ms > 0.0)) {
        return 0;
    }

    if (t->samples == 0 || !(t->rate > 0.0) || !(t->ms > 0.0)) {
        *clip_ref = ref > 0.0 ? ref : 0.0;
        *clipped_ms = kva_ttft_clipped_ms(work, ms, *clip_ref);
        *alpha = 1.0;
        t->work = work;
        t->ms = *clipped_ms;
        t->rate = work * 1000.0 / t->ms;
        t->samples = 1;
        t->steps = 1;
        return 1;
    }

    *clip_ref = t->rate;
    *clipped_ms = kva_ttft_clipped_ms(work, ms, *clip_ref);
    *alpha = (double) (t->steps + 1) * KVA_TTFT_ALPHA < 1.0
             ? 1.0 / (double) (t->steps + 1) : KVA_TTFT_ALPHA;

    t->work += *alpha * (work - t->work);
    t->ms += *alpha * (*clipped_ms - t->ms);
    t->rate = t->work * 1000.0 / t->ms;
    t->samples++;
    t->steps++;

    return 1;
}


double
kva_ttft_pool(double *rate, unsigned n, double prior)
{
    double    lo, v;
    unsigned  i, k;

    if (n == 0) {
        return prior > 0.0 ? prior : KVA_TTFT_RATE_DEFAULT;
    }

    /*
     * a selection, not a sort: it runs under the zone lock for every
     * choice, over up to KVA_MAX_SLOTS rates, and a sort of 1,024 would
     * move half a million values
     */
    k = n / 2;
    v = kva_ttft_select(rate, n, k);

    if (n & 1) {
        return v;
    }

    /* the lower middle: the largest of the k values left below rate[k] */
    lo = rate[0];

    for (i = 1; i < k; i++) {
        if (rate[i] > lo) {
            lo = rate[i];
        }
    }

    return (lo + v) / 2.0;
}


/*
 * Hoare's selection: rate[k] becomes the k-th smallest, the values
 * before it no larger, those after no smaller; linear on average, the
 * pivot the middle of three against sorted input.
 */
static double
kva_ttft_select(double *rate, unsigned n, unsigned k)
{
    double    pivot, t;
    unsigned  left, right, i, j, mid;

    left = 0;
    right = n - 1;

    while (left < right) {
        mid = left + (right - left) / 2;

        if (rate[mid] < rate[left]) {
            t = rate[mid]; rate[mid] = rate[left]; rate[left] = t;
        }

        if (rate[right] < rate[left]) {
            t = rate[right]; rate[right] = rate[left]; rate[left] = t;
        }

        if (rate[right] < rate[mid]) {
            t = rate[right]; rate[right] = rate[mid]; rate[mid] = t;
        }

        pivot = rate[mid];
        i = left;
        j = right;

        while (i <= j) {
            while (rate[i] < pivot) {
                i++;
            }

            while (rate[j] > pivot) {
                j--;
            }

            if (i <= j) {
                t = rate[i]; rate[i] = rate[j]; rate[j] = t;
                i++;

                if (j == 0) {
                    break;
                }

                j--;
            }
        }

        if (k <= j) {
            right = j;

        } else if (k >= i) {
            left = i;

        } else {
            break;
        }
    }

    return rate[k];
}


int
kva_ttft_answer(kva_ttft_t *t, double work, uint64_t start, uint64_t now,
    double ref)
{
    double  ms;

    if (!(work > 0.0)) {
        work = 0.0;
    }

    /*
     * a clock behind the last answer's (another worker's): as the last;
     * far behind, the clock wrapped (a 32-bit ngx_msec_t) or the state is
     * another clock's: a step kept open for ever would take every answer
     */
    if (now < t->last) {
        if (t->last - now > KVA_TTFT_CLOCK_MS) {
            t->group = 0;
            t->last = 0;

        } else {
            now = t->last;
        }
    }

    if (t->group && start <= t->last
        && now - t->group_first <= KVA_TTFT_BATCH_MS)
    {
        /* of the group's step: its blocks join the group's sample */
        t->last = now;

        if (t->group_alpha > 0.0) {
            if (!(work > 0.0)) {
                return 0;
            }

            /*
             * the step's sample redone with all its blocks, over the time
             * it was learned with, clipped as it was: the clip is of the
             * step's rate, not of its first answer's
             */
            t->group_work += work;
            ms = kva_ttft_clipped_ms(t->group_work, t->group_span,
                                     t->group_ref);
            t->work += t->group_alpha * work;
            t->ms += t->group_alpha * (ms - t->group_ms);
            t->group_ms = ms;
            t->rate = t->work * 1000.0 / t->ms;
            t->samples++;
            return 1;
        }

        t->group_work += work;

    } else {
        t->group = 1;
        t->group_from = (t->last > start) ? t->last : start;

        if (t->group_from > now) {
            /* a try begun before the clock wrapped: no time known */
            t->group_from = now;
        }

        t->group_first = now;
        t->group_work = work;
        t->group_alpha = 0.0;
        t->last = now;
    }

    /* not in the averages yet: the group so far, if it has work and time */
    t->group_span = (double) (now - t->group_from);

    return kva_ttft_sample(t, t->group_work, t->group_span, ref,
                           &t->group_alpha, &t->group_ref, &t->group_ms);
}


/* whether a server's own rate is trusted, and so counts in the pool's */
int
kva_ttft_learned(const kva_ttft_t *t)
{
    return t->samples >= KVA_TTFT_MIN_SAMPLES && t->rate > 0.0;
}


double
kva_ttft_rate(const kva_ttft_t *t, double pool)
{
    if (kva_ttft_learned(t)) {
        return t->rate;
    }

    return pool;
}


double
kva_ttft_speed(double rate, double pool)
{
    double  s;

    if (!(rate > 0.0) || !(pool > 0.0)) {
        return 1.0;
    }

    s = rate / pool;

    return (s < KVA_TTFT_BAND && s > 1.0 / KVA_TTFT_BAND) ? 1.0 : s;
}


double
kva_ttft_predict(double queued, double own, double rate)
{
    if (!(rate > 0.0)) {
        rate = KVA_TTFT_RATE_DEFAULT;
    }

    if (queued < 0.0) {
        queued = 0.0;
    }

    return (queued + own) * 1000.0 / rate;
}
