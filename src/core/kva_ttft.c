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
 * averages are plain means of the first 32 answers (no weight left on
 * the first one, as an average from it would keep), then forget
 * geometrically, half the weight in 22 answers: a server's speed is its
 * hardware's and changes seldom, while one answer's interval varies with
 * what the server batched and how much nginx's index was wrong about;
 * with half the weight in 5 answers, servers alike learned rates 3x
 * apart under load.  A server that slows down is followed within about
 * a hundred answers.
 */

#include <math.h>

#include "kva_ttft.h"


static double kva_ttft_clip(double v, double ref);
static int kva_ttft_sample(kva_ttft_t *t, double work, double ms, double ref,
    double *alpha, double *room);
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
    double  alpha, room;

    return kva_ttft_sample(t, work, ms, ref, &alpha, &room);
}


/*
 * One sample into the averages; *alpha is the weight it got (1: the
 * first), *room the work it may still be given at its time before its
 * rate passes the clip (kva_ttft_answer() adds the rest of a step's).
 */
static int
kva_ttft_sample(kva_ttft_t *t, double work, double ms, double ref,
    double *alpha, double *room)
{
    double  v, lim;

    /* NaN fails these too */
    if (!(work > 0.0) || !(ms > 0.0)) {
        return 0;
    }

    v = work * 1000.0 / ms;

    if (t->samples == 0 || !(t->rate > 0.0) || !(t->ms > 0.0)) {
        lim = ref > 0.0 ? ref * KVA_TTFT_CLIP : 0.0;
        v = kva_ttft_clip(v, ref);
        t->work = work;
        t->ms = work * 1000.0 / v;
        t->rate = v;
        t->samples = 1;
        *alpha = 1.0;
        *room = lim > 0.0 ? lim * t->ms / 1000.0 - work : HUGE_VAL;
        return 1;
    }

    lim = t->rate * KVA_TTFT_CLIP;
    v = kva_ttft_clip(v, t->rate);
    ms = work * 1000.0 / v;

    *alpha = (double) (t->samples + 1) * KVA_TTFT_ALPHA < 1.0
             ? 1.0 / (double) (t->samples + 1) : KVA_TTFT_ALPHA;
    *room = lim * ms / 1000.0 - work;

    t->work += *alpha * (work - t->work);
    t->ms += *alpha * (ms - t->ms);
    t->rate = t->work * 1000.0 / t->ms;
    t->samples++;

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
    double  add;

    if (!(work > 0.0)) {
        work = 0.0;
    }

    /* a clock behind the last answer's (another worker's): as the last */
    if (now < t->last) {
        now = t->last;
    }

    if (t->group && start <= t->last
        && now - t->group_first <= KVA_TTFT_BATCH_MS)
    {
        /* of the group's step: its blocks join the group's sample */
        t->last = now;

        if (t->group_alpha > 0.0) {
            add = work < t->group_room ? work : t->group_room;

            if (!(add > 0.0)) {
                return 0;
            }

            t->group_room -= add;
            t->work += t->group_alpha * add;
            t->rate = t->work * 1000.0 / t->ms;
            t->samples++;
            return 1;
        }

        t->group_work += work;

    } else {
        t->group = 1;
        t->group_from = (t->last > start) ? t->last : start;
        t->group_first = now;
        t->group_work = work;
        t->group_alpha = 0.0;
        t->last = now;
    }

    /* not in the averages yet: the group so far, if it has work and time */
    if (!kva_ttft_sample(t, t->group_work, (double) (now - t->group_from),
                         ref, &t->group_alpha, &t->group_room))
    {
        return 0;
    }

    return 1;
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
