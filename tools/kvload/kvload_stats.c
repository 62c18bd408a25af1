/*
 * kvload statistics.  Percentiles interpolate linearly between the closest
 * ranks (numpy's default), like vLLM's and llm-d's benchmark scripts.
 */

#include <stdlib.h>
#include <string.h>

#include "kvload_stats.h"


static int kvl_cmp_double(const void *a, const void *b);


int
kvl_samples_add(kvl_samples_t *s, double x)
{
    size_t   cap;
    double  *v;

    if (s->n == s->cap) {
        cap = s->cap ? s->cap * 2 : 1024;

        v = realloc(s->v, cap * sizeof(double));
        if (v == NULL) {
            return -1;
        }

        s->v = v;
        s->cap = cap;
    }

    s->v[s->n++] = x;
    s->sorted = 0;

    return 0;
}


double
kvl_percentile(kvl_samples_t *s, double p)
{
    double  rank, frac;
    size_t  lo;

    if (s->n == 0) {
        return 0.0;
    }

    if (!s->sorted) {
        qsort(s->v, s->n, sizeof(double), kvl_cmp_double);
        s->sorted = 1;
    }

    rank = (p < 0.0 ? 0.0 : p > 100.0 ? 1.0 : p / 100.0) * (s->n - 1);
    lo = (size_t) rank;
    frac = rank - (double) lo;

    if (lo + 1 >= s->n) {
        return s->v[s->n - 1];
    }

    return s->v[lo] + frac * (s->v[lo + 1] - s->v[lo]);
}


void
kvl_samples_free(kvl_samples_t *s)
{
    free(s->v);
    memset(s, 0, sizeof(kvl_samples_t));
}


double
kvl_hit_rate(uint64_t cached, uint64_t prompt)
{
    /* token-weighted: a long prompt counts for more than a short one */

    if (prompt == 0) {
        return 0.0;
    }

    return (double) cached / (double) prompt;
}


void
kvl_stage_backend(kvl_stage_t *st, const char *name)
{
    size_t  i;

    if (name == NULL || name[0] == '\0') {
        st->backend_unknown++;
        return;
    }

    for (i = 0; i < st->nbackends; i++) {
        if (strncmp(st->backends[i].name, name, KVL_BACKEND_LEN - 1) == 0) {
            st->backends[i].requests++;
            return;
        }
    }

    if (st->nbackends == KVL_MAX_BACKENDS) {
        st->backend_unknown++;
        return;
    }

    strncpy(st->backends[i].name, name, KVL_BACKEND_LEN - 1);
    st->backends[i].name[KVL_BACKEND_LEN - 1] = '\0';
    st->backends[i].requests = 1;
    st->nbackends++;
}


void
kvl_stage_summarize(kvl_stage_t *st, double scale, kvl_summary_t *sum)
{
    double  span;

    memset(sum, 0, sizeof(kvl_summary_t));

    /* rates over the arrival window: what the servers did under its load */

    span = (st->t_arrivals_end - st->t_start) * scale;
    if (span > 0.0) {
        sum->achieved_qps = (double) st->sent / span;
        sum->gen_tok_s = (double) st->window_tokens / span;
    }

    sum->ttft_p50 = kvl_percentile(&st->ttft, 50.0) * scale;
    sum->ttft_p90 = kvl_percentile(&st->ttft, 90.0) * scale;
    sum->ttft_p99 = kvl_percentile(&st->ttft, 99.0) * scale;
    sum->itl_p50 = kvl_percentile(&st->itl, 50.0) * scale;
    sum->gap_p50 = kvl_percentile(&st->gap, 50.0) * scale;
    sum->gap_p99 = kvl_percentile(&st->gap, 99.0) * scale;
    sum->e2e_p50 = kvl_percentile(&st->e2e, 50.0) * scale;

    sum->hit_rate = kvl_hit_rate(st->cached_tokens, st->prompt_tokens);

    if (st->scrapes) {
        sum->waiting_mean = st->waiting_sum / (double) st->scrapes;
    }
}


void
kvl_stage_free(kvl_stage_t *st)
{
    kvl_samples_free(&st->ttft);
    kvl_samples_free(&st->itl);
    kvl_samples_free(&st->gap);
    kvl_samples_free(&st->e2e);
}


static int
kvl_cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}
