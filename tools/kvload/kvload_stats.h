/*
 * kvload statistics, pure C without I/O.  Times go in as measured (real,
 * compressed seconds); kvl_stage_summarize() multiplies them by the time
 * scale, so summaries read as uncompressed ("GPU") seconds.
 */

#ifndef _KVLOAD_STATS_H_INCLUDED_
#define _KVLOAD_STATS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVL_MAX_BACKENDS   64
#define KVL_BACKEND_LEN    48


typedef struct {
    double         *v;
    size_t          n;
    size_t          cap;
    int             sorted;
} kvl_samples_t;


typedef struct {
    char            name[KVL_BACKEND_LEN];
    uint64_t        requests;
} kvl_backend_t;


typedef struct {
    double          qps;                /* target, uncompressed */
    double          seconds;            /* its length; 0: --stage-seconds */
    unsigned        warmup:1;           /* --warmup: reported apart */

    uint64_t        sent;
    uint64_t        completed;
    uint64_t        errors;             /* non-200, resets, timeouts */
    uint64_t        timeouts;
    uint64_t        http_5xx;           /* the proxy or a server said no */
    uint64_t        cut;                /* 200, then the stream broke */
    uint64_t        retried;            /* sent again: keep-alive closed */
    uint64_t        dropped;            /* over the in-flight cap */
    uint64_t        inflight;

    uint64_t        output_tokens;      /* of this stage's requests */
    uint64_t        window_tokens;      /* of all, while stage arrives */
    uint64_t        prompt_tokens;
    uint64_t        cached_tokens;

    double          t_start;            /* real seconds, monotonic */
    double          t_arrivals_end;

    kvl_samples_t   ttft;
    kvl_samples_t   itl;                /* per-request mean token gap */
    kvl_samples_t   gap;                /* every gap between two tokens */
    kvl_samples_t   e2e;

    double          waiting_sum;        /* per-server means, per scrape */
    uint64_t        scrapes;

    kvl_backend_t   backends[KVL_MAX_BACKENDS];
    size_t          nbackends;
    uint64_t        backend_unknown;
} kvl_stage_t;


typedef struct {
    double          achieved_qps;       /* uncompressed */
    double          ttft_p50;
    double          ttft_p90;
    double          ttft_p99;
    double          itl_p50;
    double          gap_p50;            /* token gaps: a stalled step */
    double          gap_p99;
    double          e2e_p50;
    double          gen_tok_s;          /* window tokens, uncompressed */
    double          hit_rate;
    double          waiting_mean;
} kvl_summary_t;


int kvl_samples_add(kvl_samples_t *s, double x);
double kvl_percentile(kvl_samples_t *s, double p);
void kvl_samples_free(kvl_samples_t *s);

double kvl_hit_rate(uint64_t cached, uint64_t prompt);
void kvl_stage_backend(kvl_stage_t *st, const char *name);
void kvl_stage_summarize(kvl_stage_t *st, double scale, kvl_summary_t *sum);
void kvl_stage_free(kvl_stage_t *st);


#endif /* _KVLOAD_STATS_H_INCLUDED_ */
