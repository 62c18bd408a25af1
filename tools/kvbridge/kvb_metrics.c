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
 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_metrics.h"



typedef enum {
    KVB_M_RUNNING = 0,
    KVB_M_WAITING,
    KVB_M_USAGE
} kvb_metric_e;

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
    kvb_metric("sglang:token_usage", KVB_M_USAGE)
};

#define KVB_METRIC_NAMES                                                      \
    (sizeof(kvb_metric_names) / sizeof(kvb_metric_names[0]))


static int kvb_metrics_line(const char *p, const char *end,
    kvb_metric_e *kind, double *value);
static const char *kvb_metrics_labels(const char *p, const char *end);
static int kvb_name_char(int c, int first);


int
kvb_metrics_parse(const char *text, size_t len, kvb_load_t *load)
{
    double        count[2], usage, v;
    const char   *p, *end, *nl, *eol;
    kvb_metric_e  kind;

    memset(load, 0, sizeof(kvb_load_t));

    count[KVB_M_RUNNING] = 0;
    count[KVB_M_WAITING] = 0;
    usage = 0;

    p = text;
    end = text + len;

    while (p < end) {
        nl = memchr(p, '\n', end - p);
        eol = nl ? nl : end;

        if ((size_t) (eol - p) <= KVB_METRICS_LINE_MAX
            && kvb_metrics_line(p, eol, &kind, &v) == 0)
        {
            switch (kind) {

            case KVB_M_RUNNING:
                count[KVB_M_RUNNING] += v;
                load->have_running = 1;
                break;

            case KVB_M_WAITING:
                count[KVB_M_WAITING] += v;
                load->have_waiting = 1;
                break;

            default: /* KVB_M_USAGE */
                if (v > usage) {
                    usage = v > 1.0 ? 1.0 : v;
                }
                load->have_usage = 1;
                break;
            }
        }

        p = nl ? nl + 1 : end;
    }

    /* the engines print counts as floats, "3.0": round, then saturate */
    load->running = count[KVB_M_RUNNING] >= 4294967295.0
                    ? UINT32_MAX : (uint32_t) (count[KVB_M_RUNNING] + 0.5);
    load->waiting = count[KVB_M_WAITING] >= 4294967295.0
                    ? UINT32_MAX : (uint32_t) (count[KVB_M_WAITING] + 0.5);
    load->kv_usage = usage;

    return (load->have_running || load->have_waiting || load->have_usage)
           ? 0 : -1;
}


/*
 * One line: a sample of a name we read, with a usable value, gives 0;
 * comments, other names and malformed lines give -1.
 */

static int
kvb_metrics_line(const char *p, const char *end, kvb_metric_e *kind,
    double *value)
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

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    if (p < end && *p == '{') {
        p = kvb_metrics_labels(p + 1, end);
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

    return 0;
}


/* after "{": returns what follows "}", or NULL */

static const char *
kvb_metrics_labels(const char *p, const char *end)
{
    const char  *q;

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


static int
kvb_name_char(int c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'
           || c == ':' || (!first && c >= '0' && c <= '9');
}
