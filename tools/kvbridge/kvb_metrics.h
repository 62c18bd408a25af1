/*
 * kvbridge: an engine's load (requests running and waiting, KV cache
 * usage), read from its Prometheus /metrics text: kvb_metrics_parse()
 * reads the text exposition format 0.0.4 and picks out vLLM's and
 * SGLang's load gauges.  Pure: no I/O, no allocation.  kvb_scrape.h
 * fetches the text, kvb_chunked.h undoes its transfer coding.
 */

#ifndef _KVB_METRICS_H_INCLUDED_
#define _KVB_METRICS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


/* a longer line is skipped whole: no real sample comes near it */
#define KVB_METRICS_LINE_MAX   (64 * 1024)



typedef struct {
    uint32_t  waiting;
    uint32_t  running;
    double    kv_usage;           /* fraction in [0, 1] */
    uint64_t  kv_tokens;          /* the KV pool in tokens, up to 2^48 */
    unsigned  have_waiting:1;
    unsigned  have_running:1;
    unsigned  have_usage:1;
    unsigned  have_tokens:1;
} kvb_load_t;


/*
 * Series of one name (an engine or a model each) are added up, usage is
 * their maximum, clamped to [0, 1]; counts saturate at UINT32_MAX, the
 * pool (kv_tokens: vLLM's cache_config_info, SGLang's
 * max_total_num_tokens) at 2^48.
 * Negative and NaN samples are ignored.  Returns 0 if any of them
 * was found, -1 otherwise.  Reads text[0, len) only, allocates nothing.
 */
int kvb_metrics_parse(const char *text, size_t len, kvb_load_t *load);

/* ranks of one server: vLLM's engine="r", SGLang's dp_rank="r" */
#define KVB_METRICS_RANKS      1024

/*
 * The same sums into all, and each rank's own into ranks[0, nranks):
 * the series labelled with that rank (vLLM's engine, SGLang's dp_rank),
 * and for rank 0 also those without such a label (a single engine); a
 * series labelled with a value that is no rank below 64 is no rank's.
 * Returns what kvb_metrics_parse() returns for all.
 */
int kvb_metrics_parse_ranks(const char *text, size_t len, kvb_load_t *all,
    kvb_load_t *ranks, unsigned nranks);


#endif /* _KVB_METRICS_H_INCLUDED_ */
