/*
 * libFuzzer target: kvbridge's reader of an engine's /metrics
 * (tools/kvbridge/kvb_metrics.c), the exposition parser and the chunked
 * decoder, both fed the same input.
 *
 * The parser must return a load it promises: usage in [0, 1], a found
 * flag for 0, nothing for -1; read per data-parallel rank, it must give
 * the same sums, and no rank more than all of them together.  The
 * decoder must agree with itself: the input decoded whole into another
 * buffer, and decoded in place in pieces cut where the input's first
 * byte says, give the same result, the same data and the same bytes
 * used; data never outruns its input.  Any disagreement aborts.
 *
 *   make build/fuzz/fuzz_kvb_metrics
 *   build/fuzz/fuzz_kvb_metrics fuzz/corpus/kvb_metrics
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_chunked.h"
#include "kvb_metrics.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_parse(const uint8_t *data, size_t size);
static void fz_ranks(const uint8_t *data, size_t size, int rc,
    const kvb_load_t *load);
static void fz_chunked(const uint8_t *data, size_t size);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_parse(data, size);
    fz_chunked(data, size);

    return 0;
}


static void
fz_parse(const uint8_t *data, size_t size)
{
    int         rc;
    kvb_load_t  load;

    rc = kvb_metrics_parse((const char *) data, size, &load);

    if (rc == 0) {
        if (!load.have_running && !load.have_waiting && !load.have_usage
            && !load.have_tokens)
        {
            abort();
        }

        /* the pool is bounded as nginx's decoder bounds it */
        if (load.kv_tokens > (1ULL << 48)
            || (!load.have_tokens && load.kv_tokens != 0))
        {
            abort();
        }

        /* NaN fails both comparisons: written so that it aborts too */
        if (!(load.kv_usage >= 0.0 && load.kv_usage <= 1.0)) {
            abort();
        }

        if (!load.have_usage && load.kv_usage != 0.0) {
            abort();
        }

    } else if (rc != -1 || load.have_running || load.have_waiting
               || load.have_usage || load.have_tokens || load.running
               || load.waiting || load.kv_tokens)
    {
        abort();
    }

    fz_ranks(data, size, rc, &load);
}


static void
fz_ranks(const uint8_t *data, size_t size, int rc, const kvb_load_t *load)
{
    unsigned    r;
    kvb_load_t  all, ranks[KVB_METRICS_RANKS];

    if (kvb_metrics_parse_ranks((const char *) data, size, &all, ranks,
                                KVB_METRICS_RANKS)
        != rc
        || all.running != load->running || all.waiting != load->waiting
        || !(all.kv_usage == load->kv_usage)
        || all.have_running != load->have_running
        || all.have_waiting != load->have_waiting
        || all.have_usage != load->have_usage
        || all.kv_tokens != load->kv_tokens
        || all.have_tokens != load->have_tokens)
    {
        abort();
    }

    for (r = 0; r < KVB_METRICS_RANKS; r++) {
        if (ranks[r].running > all.running || ranks[r].waiting > all.waiting
            || ranks[r].kv_usage > all.kv_usage
            || (ranks[r].have_usage && !all.have_usage)
            || ranks[r].kv_tokens > all.kv_tokens)
        {
            abort();
        }
    }
}


static void
fz_chunked(const uint8_t *data, size_t size)
{
    char              *whole, *inplace;
    size_t             o1, u1, o2, u2, at, step, n, o, u;
    kvb_chunked_t      c;
    kvb_chunked_rc_e   rc1, rc2;

    whole = malloc(size ? size : 1);
    inplace = malloc(size ? size : 1);
    if (whole == NULL || inplace == NULL) {
        abort();
    }

    kvb_chunked_init(&c);
    rc1 = kvb_chunked_decode(&c, (const char *) data, size, whole, &o1, &u1);

    if (u1 > size || o1 > u1 || (rc1 == KVB_CHUNKED_MORE && u1 != size)) {
        abort();
    }

    /* the client's way: in place, in reads of any size */
    memcpy(inplace, data, size);
    step = size ? (size_t) data[0] % 17 + 1 : 1;

    kvb_chunked_init(&c);
    rc2 = KVB_CHUNKED_MORE;
    at = 0;
    o2 = 0;
    u2 = 0;

    while (at < size && rc2 == KVB_CHUNKED_MORE) {
        n = size - at < step ? size - at : step;

        rc2 = kvb_chunked_decode(&c, inplace + at, n, inplace + o2, &o, &u);

        if (u > n || o > u) {
            abort();
        }

        o2 += o;
        u2 += u;
        at += n;
        step = step * 3 % 31 + 1;
    }

    /* a byte at a time inside: an error too is found at the same byte */
    if (rc1 != rc2 || o1 != o2 || u1 != u2
        || memcmp(whole, inplace, o1) != 0)
    {
        abort();
    }

    free(whole);
    free(inplace);
}
