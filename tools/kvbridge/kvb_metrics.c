/*
 * kvbridge: an engine's load from its Prometheus /metrics (see
 * kvb_metrics.h).
 *
 * The gauges read, from the engines' code:
 *
 *   vLLM    vllm:num_requests_running, vllm:num_requests_waiting,
 *           vllm:kv_cache_usage_perc (before v0.10: gpu_cache_usage_perc;
 *           "1 means 100 percent usage" in both, a fraction despite the
 *           name), labels model_name and engine, one series an engine;
 *   SGLang  sglang:num_running_reqs, sglang:num_queue_reqs,
 *           sglang:token_usage (a fraction), one series a DP rank.
 *
 * and the KV pool's size in tokens, what nginx bounds its learned state
 * of the server by (load.kv_tokens): vLLM's vllm:cache_config_info, an
 * info metric whose labels block_size and num_gpu_blocks multiply to it,
 * and SGLang's sglang:max_total_num_tokens.
 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_metrics.h"



typedef enum {
    KVB_M_RUNNING = 0,
    KVB_M_WAITING,
    KVB_M_USAGE,
    KVB_M_TOKENS,
    KVB_M_CACHE_INFO            /* its labels say the pool, not its value */
} kvb_metric_e;


/* what a series' labels say: its rank, and vLLM's pool */
typedef struct {
    int           rank;         /* -1: none */
    uint64_t      block_size;
    uint64_t      gpu_blocks;
} kvb_series_t;

typedef struct {
    const char    *name;
    size_t         len;
    kvb_metric_e   kind;
} kvb_metric_name_t;


#define kvb_metric(s, k)  { s, sizeof(s) - 1, k }

static const kvb_metric_name_t  kvb_metric_names[] = {
    kvb_metric("vllm:num_requests_running", KVB_M_RUNNING),
    kvb_metric("vllm:num_requests_waiting", KVB_M_WAITING),
    kvb_metric("vllm:kv_cache_usage_perc", KVB_M_USAGE),
    kvb_metric("vllm:gpu_cache_usage_perc", KVB_M_USAGE),
    kvb_metric("sglang:num_running_reqs", KVB_M_RUNNING),
    kvb_metric("sglang:num_queue_reqs", KVB_M_WAITING),
    kvb_metric("sglang:token_usage", KVB_M_USAGE),
    kvb_metric("vllm:cache_config_info", KVB_M_CACHE_INFO),
    kvb_metric("sglang:max_total_num_tokens", KVB_M_TOKENS)
};

#define KVB_METRIC_NAMES                                                      \
    (sizeof(kvb_metric_names) / sizeof(kvb_metric_names[0]))


typedef struct kvb_acc_s  kvb_acc_t;

static void kvb_metrics_add(kvb_acc_t *a, kvb_metric_e kind, double v);
static int kvb_metrics_load(const kvb_acc_t *a, kvb_load_t *load);
static int kvb_metrics_line(const char *p, const char *end,
    kvb_metric_e *kind, double *value, kvb_series_t *series);
static const char *kvb_metrics_labels(const char *p, const char *end,
    kvb_series_t *series);
static void kvb_metrics_pool(const char *name, size_t nlen,
    const char *value, size_t vlen, kvb_series_t *series);
static int kvb_metrics_rank(const char *name, size_t nlen,
    const char *value, size_t vlen);
static int kvb_name_char(int c, int first);


int
kvb_metrics_parse(const char *text, size_t len, kvb_load_t *load)
{
    return kvb_metrics_parse_ranks(text, len, load, NULL, 0);
}


/* sums per rank, then rounded and saturated as the loads say */

struct kvb_acc_s {
    double        count[2];
    double        usage;
    double        tokens;
    kvb_load_t    have;
};


int
kvb_metrics_parse_ranks(const char *text, size_t len, kvb_load_t *all,
    kvb_load_t *ranks, unsigned nranks)
{
    int           rank;
    double        v;
    unsigned      r;
    kvb_acc_t     acc[1 + KVB_METRICS_RANKS];
    kvb_series_t  series;
    const char   *p, *end, *nl, *eol;
    kvb_metric_e  kind;

    nranks = nranks < KVB_METRICS_RANKS ? nranks : KVB_METRICS_RANKS;
    memset(acc, 0, (1 + nranks) * sizeof(kvb_acc_t));

    p = text;
    end = text + len;

    while (p < end) {
        nl = memchr(p, '\n', end - p);
        eol = nl ? nl : end;

        if ((size_t) (eol - p) <= KVB_METRICS_LINE_MAX
            && kvb_metrics_line(p, eol, &kind, &v, &series) == 0)
        {
            kvb_metrics_add(&acc[0], kind, v);

            /* a series without a rank label is rank 0's (one engine) */
            rank = series.rank < 0 ? 0 : series.rank;

            if ((unsigned) rank < nranks) {
                kvb_metrics_add(&acc[1 + rank], kind, v);
            }
        }

        p = nl ? nl + 1 : end;
    }

    for (r = 0; r < nranks; r++) {
        kvb_metrics_load(&acc[1 + r], &ranks[r]);
    }

    return kvb_metrics_load(&acc[0], all);
}


static void
kvb_metrics_add(kvb_acc_t *a, kvb_metric_e kind, double v)
{
    switch (kind) {

    case KVB_M_RUNNING:
        a->count[KVB_M_RUNNING] += v;
        a->have.have_running = 1;
        break;

    case KVB_M_WAITING:
        a->count[KVB_M_WAITING] += v;
        a->have.have_waiting = 1;
        break;

    case KVB_M_TOKENS:
    case KVB_M_CACHE_INFO:
        /* each rank's pool its own: a server's is their sum */
        a->tokens += v;
        a->have.have_tokens = 1;
        break;

    default: /* KVB_M_USAGE */
        if (v > a->usage) {
            a->usage = v > 1.0 ? 1.0 : v;
        }
        a->have.have_usage = 1;
        break;
    }
}


static int
kvb_metrics_load(const kvb_acc_t *a, kvb_load_t *load)
{
    *load = a->have;

    /* the engines print counts as floats, "3.0": round, then saturate */
    load->running = a->count[KVB_M_RUNNING] >= 4294967295.0
                    ? UINT32_MAX
                    : (uint32_t) (a->count[KVB_M_RUNNING] + 0.5);
    load->waiting = a->count[KVB_M_WAITING] >= 4294967295.0
                    ? UINT32_MAX
                    : (uint32_t) (a->count[KVB_M_WAITING] + 0.5);
    load->kv_usage = a->usage;
    load->kv_tokens = a->tokens >= 281474976710656.0     /* 2^48 */
                      ? 281474976710656ULL : (uint64_t) (a->tokens + 0.5);

    return (load->have_running || load->have_waiting || load->have_usage
            || load->have_tokens)
           ? 0 : -1;
}


/*
 * One line: a sample of a name we read, with a usable value, gives 0;
 * comments, other names and malformed lines give -1.
 */

static int
kvb_metrics_line(const char *p, const char *end, kvb_metric_e *kind,
    double *value, kvb_series_t *series)
{
    char        num[64], *last;
    size_t      i, n;
    double      v;
    const char  *q;

    if (end > p && end[-1] == '\r') {
        end--;
    }

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    if (p == end || *p == '#') {
        return -1;
    }

    for (q = p; q < end && kvb_name_char((unsigned char) *q, q == p); q++) {
        /* void */
    }

    n = q - p;

    for (i = 0; i < KVB_METRIC_NAMES; i++) {
        if (kvb_metric_names[i].len == n
            && memcmp(kvb_metric_names[i].name, p, n) == 0)
        {
            break;
        }
    }

    if (n == 0 || i == KVB_METRIC_NAMES) {
        return -1;
    }

    p = q;
    series->rank = -1;
    series->block_size = 0;
    series->gpu_blocks = 0;

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    if (p < end && *p == '{') {
        p = kvb_metrics_labels(p + 1, end, series);
        if (p == NULL) {
            return -1;
        }

        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

    } else if (p == q) {
        /* "vllm:num_requests_runningX 1" was cut short by the name scan */
        return -1;
    }

    for (q = p; q < end && *q != ' ' && *q != '\t'; q++) {
        /* void */
    }

    n = q - p;

    if (n == 0 || n >= sizeof(num)) {
        return -1;
    }

    /*
     * strtod() wants a terminated string, the text is not; it reads
     * NaN, +Inf and exponents as Prometheus writes them, in the C locale
     * the bridge never leaves
     */
    memcpy(num, p, n);
    num[n] = '\0';

    v = strtod(num, &last);

    /* the optional timestamp after the value is of no use to a gauge */
    if (last != num + n || isnan(v) || v < 0) {
        return -1;
    }

    *kind = kvb_metric_names[i].kind;
    *value = v;

    if (*kind == KVB_M_CACHE_INFO) {
        /* an info metric: 1, its labels say the pool */
        if (series->block_size == 0 || series->gpu_blocks == 0) {
            return -1;
        }

        *value = (double) series->block_size * (double) series->gpu_blocks;
    }

    return 0;
}


/*
 * after "{": returns what follows "}", or NULL; *rank is the series'
 * data-parallel rank if a label names one
 */

static const char *
kvb_metrics_labels(const char *p, const char *end, kvb_series_t *series)
{
    int          r;
    const char  *q, *name, *value;
    size_t       nlen;

    for ( ;; ) {
        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p == end) {
            return NULL;
        }

        if (*p == '}') {
            return p + 1;
        }

        for (q = p; q < end && kvb_name_char((unsigned char) *q, q == p)
                    && *q != ':';
             q++)
        {
            /* void */
        }

        if (q == p) {
            return NULL;
        }

        name = p;
        nlen = q - p;
        p = q;

        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p == end || *p++ != '=') {
            return NULL;
        }

        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p == end || *p++ != '"') {
            return NULL;
        }

        value = p;

        /* \\, \" and \n: a backslash always takes the next byte along */
        while (p < end && *p != '"') {
            if (*p == '\\') {
                p++;
                if (p == end) {
                    return NULL;
                }
            }

            p++;
        }

        if (p == end) {
            return NULL;
        }

        r = kvb_metrics_rank(name, nlen, value, p - value);
        if (r >= 0) {
            series->rank = r;
        }

        kvb_metrics_pool(name, nlen, value, p - value, series);

        p++;

        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }

        if (p < end && *p == ',') {
            p++;
            continue;
        }

        if (p < end && *p == '}') {
            return p + 1;
        }

        return NULL;
    }
}


/*
 * vLLM labels each data-parallel engine's series engine="r" (its v1
 * PrometheusStatLogger, labelnames model_name and engine); SGLang adds
 * dp_rank="r" to its schedulers' when it runs data parallel.  -1: not a
 * rank's label; KVB_METRICS_RANKS: a value that names none of ours (not
 * a decimal number below 64), so no rank's.
 */

static int
kvb_metrics_rank(const char *name, size_t nlen, const char *value,
    size_t vlen)
{
    int     r;
    size_t  i;

    if (!((nlen == 6 && memcmp(name, "engine", 6) == 0)
          || (nlen == 7 && memcmp(name, "dp_rank", 7) == 0)))
    {
        return -1;
    }

    /* a rank's label with a value past our ranks: no rank of ours */

    if (vlen == 0 || vlen > 2 || (vlen == 2 && value[0] == '0')) {
        return KVB_METRICS_RANKS;
    }

    r = 0;

    for (i = 0; i < vlen; i++) {
        if (value[i] < '0' || value[i] > '9') {
            return KVB_METRICS_RANKS;
        }

        r = r * 10 + (value[i] - '0');
    }

    return r < KVB_METRICS_RANKS ? r : KVB_METRICS_RANKS;
}


/* vLLM's cache_config_info: block_size="16", num_gpu_blocks="27000" */

static void
kvb_metrics_pool(const char *name, size_t nlen, const char *value,
    size_t vlen, kvb_series_t *series)
{
    size_t     i;
    uint64_t   n, *to;

    if (nlen == 10 && memcmp(name, "block_size", 10) == 0) {
        to = &series->block_size;

    } else if (nlen == 14 && memcmp(name, "num_gpu_blocks", 14) == 0) {
        to = &series->gpu_blocks;

    } else {
        return;
    }

    /* a decimal count below 2^40, else unsaid ("None" before profiling) */
    if (vlen == 0 || vlen > 12) {
        return;
    }

    n = 0;

    for (i = 0; i < vlen; i++) {
        if (value[i] < '0' || value[i] > '9') {
            return;
        }

        n = n * 10 + (uint64_t) (value[i] - '0');
    }

    *to = n;
}


static int
kvb_name_char(int c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'
           || c == ':' || (!first && c >= '0' && c <= '9');
}
