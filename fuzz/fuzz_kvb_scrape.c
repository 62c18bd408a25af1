/*
 * libFuzzer target: kvbridge's /metrics client past recv()
 * (tools/kvbridge/kvb_scrape.c): the status line, the headers, the body
 * by length, by chunks or to the close, the encodings it refuses and the
 * caps, the server closing early.
 *
 * The input's first byte says where to cut the response into reads, its
 * second whether the server closes after it; the rest is the response.
 * Fed at once and fed in pieces, a scrape must end the same way: done or
 * failed alike, for the same kind, with the same load; and its counts
 * must agree (a scrape that ended is one ok or one failure, counted
 * under one kind; one still reading, none).  A load must be one the
 * parser promises: usage in [0, 1].  Any disagreement aborts.
 *
 *   make build/fuzz/fuzz_kvb_scrape
 *   build/fuzz/fuzz_kvb_scrape fuzz/corpus/kvb_scrape
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvb_log.h"
#include "kvb_scrape.h"


#define FZ_NOW  1000


typedef struct {
    int                  reading;
    int                  have_load;
    kvb_load_t           load;
    kvb_load_t           rank1;
    int                  have_rank1;
    kvb_scrape_stats_t   st;
    char                 error[160];    /* st.last_error points into s */
} fz_end_t;


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_run(const uint8_t *data, size_t size, size_t step, int eof,
    fz_end_t *end);
static void fz_check(const fz_end_t *e);
static int fz_same_load(const kvb_load_t *a, const kvb_load_t *b);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int       eof;
    size_t    step;
    fz_end_t  whole, pieces;

    if (size < 2) {
        return 0;
    }

    /* the limiter still runs; the lines would only slow the fuzzer */
    kvb_log_level = KVB_LOG_ERR;

    step = (size_t) data[0] % 23 + 1;
    eof = data[1] & 1;
    data += 2;
    size -= 2;

    fz_run(data, size, 0, eof, &whole);
    fz_run(data, size, step, eof, &pieces);

    fz_check(&whole);
    fz_check(&pieces);

    if (whole.reading != pieces.reading
        || whole.have_load != pieces.have_load
        || whole.st.ok != pieces.st.ok
        || whole.st.failed != pieces.st.failed
        || whole.st.last_kind != pieces.st.last_kind
        || whole.st.last_status != pieces.st.last_status
        || memcmp(whole.st.failures, pieces.st.failures,
                  sizeof(whole.st.failures)) != 0
        || strcmp(whole.error, pieces.error) != 0
        || whole.have_rank1 != pieces.have_rank1)
    {
        abort();
    }

    if (whole.have_load
        && (!fz_same_load(&whole.load, &pieces.load)
            || (whole.have_rank1
                && !fz_same_load(&whole.rank1, &pieces.rank1))))
    {
        abort();
    }

    return 0;
}


/* step 0: the whole response in one feed */

static void
fz_run(const uint8_t *data, size_t size, size_t step, int eof, fz_end_t *end)
{
    int            rc;
    char           err[128];
    size_t         at, n;
    uint64_t       taken;
    kvb_scrape_t  *s;

    s = kvb_scrape_create("http://127.0.0.1:9/metrics", 1000, 1000, err,
                          sizeof(err));
    if (s == NULL) {
        abort();
    }

    kvb_scrape_feed_start(s, FZ_NOW);

    rc = 1;
    at = 0;

    while (rc == 1 && at < size) {
        n = (step == 0 || size - at < step) ? size - at : step;

        rc = kvb_scrape_feed(s, (const char *) data + at, n, FZ_NOW);
        if (rc == -1) {
            /* the client had no room for a byte it had to take */
            abort();
        }

        at += n;

        if (step) {
            step = step * 7 % 29 + 1;
        }
    }

    if (rc == 1 && eof) {
        kvb_scrape_feed_eof(s, FZ_NOW);
    }

    memset(end, 0, sizeof(*end));
    kvb_scrape_stats(s, &end->st);
    end->reading = (end->st.ok + end->st.failed == 0);
    end->have_load = (kvb_scrape_load(s, &end->load, &taken) == 0);
    end->have_rank1 = (kvb_scrape_rank_load(s, 1, &end->rank1, &taken)
                       == 0);

    strncpy(end->error, end->st.last_error, sizeof(end->error) - 1);
    end->st.last_error = NULL;

    kvb_scrape_destroy(s);
}


static void
fz_check(const fz_end_t *e)
{
    unsigned  k;
    uint64_t  sum;

    if (e->st.ok + e->st.failed > 1 || (e->st.ok && !e->have_load)
        || (!e->st.ok && e->have_load) || (e->st.failed && !e->st.last_failed)
        || e->st.last_kind >= KVB_SCRAPE_ERR_KINDS)
    {
        abort();
    }

    sum = 0;

    for (k = 0; k < KVB_SCRAPE_ERR_KINDS; k++) {
        sum += e->st.failures[k];
    }

    if (sum != e->st.failed
        || (e->st.failed && e->st.failures[e->st.last_kind] != 1))
    {
        abort();
    }

    /* NaN fails both comparisons: written so that it aborts too */
    if (e->have_load && !(e->load.kv_usage >= 0.0 && e->load.kv_usage <= 1.0))
    {
        abort();
    }
}


static int
fz_same_load(const kvb_load_t *a, const kvb_load_t *b)
{
    return a->running == b->running && a->waiting == b->waiting
           && memcmp(&a->kv_usage, &b->kv_usage, sizeof(a->kv_usage)) == 0
           && a->kv_tokens == b->kv_tokens
           && a->have_running == b->have_running
           && a->have_waiting == b->have_waiting
           && a->have_usage == b->have_usage
           && a->have_tokens == b->have_tokens;
}
