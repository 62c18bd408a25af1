/*
 * libFuzzer target: kvbridge's decoder of vLLM and SGLang event batches
 * (tools/kvbridge/kvb_vllm.c) and the scan that bounds msgpack-c before
 * it allocates (kvb_scan.c).
 *
 * The scan is checked against msgpack-c itself: what the scan passes,
 * msgpack-c must unpack whole, and a value the scan found complete with
 * bytes after it, msgpack-c must unpack and stop before them.  (Inputs
 * the scan refuses for a huge claim are never handed to msgpack-c: that
 * is the allocation the scan exists to prevent.)  A decoded batch must
 * keep what kvb_vllm.h promises.  Any disagreement aborts.
 *
 *   make build/fuzz/fuzz_kvb_decode
 *   build/fuzz/fuzz_kvb_decode fuzz/corpus/kvb_decode
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "kvb_scan.h"
#include "kvb_vllm.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_scan_vs_msgpack(const uint8_t *data, size_t size);
static void fz_check_batch(const kvb_batch_t *b, const kvb_limits_t *lim);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char          err[160];
    kvb_rc_e      rc;
    kvb_batch_t   b;
    kvb_limits_t  lim = { 1 << 16, 8, 64 };

    fz_scan_vs_msgpack(data, size);

    rc = kvb_decode((const char *) data, size, &lim, &b, err, sizeof(err));

    if (rc == KVB_OK) {
        fz_check_batch(&b, &lim);

    } else if (err[0] == '\0') {
        /* every refusal says why, for the bridge's log line */
        abort();
    }

    kvb_batch_free(&b);

    return 0;
}


static void
fz_scan_vs_msgpack(const uint8_t *data, size_t size)
{
    size_t                 values, off;
    kvb_scan_rc_e          src;
    msgpack_unpacked       u;
    msgpack_unpack_return  urc;

    src = kvb_scan(data, size, size, &values);

    if (src != KVB_SCAN_OK && src != KVB_SCAN_TRAILING) {
        return;
    }

    msgpack_unpacked_init(&u);
    off = 0;
    urc = msgpack_unpack_next(&u, (const char *) data, size, &off);

    if (urc != MSGPACK_UNPACK_SUCCESS && urc != MSGPACK_UNPACK_EXTRA_BYTES) {
        abort();
    }

    if ((src == KVB_SCAN_OK) != (off == size)) {
        abort();
    }

    msgpack_unpacked_destroy(&u);
}


static void
fz_check_batch(const kvb_batch_t *b, const kvb_limits_t *lim)
{
    uint32_t         i, j;
    uint64_t         h;
    size_t           hashes;
    const kvb_ev_t  *ev;

    if (b->nevents + b->unknown + b->malformed > lim->max_events
        || (b->nevents > 0 && b->events == NULL)
        || (b->has_rank && b->rank < 0))
    {
        abort();
    }

    hashes = 0;

    for (i = 0; i < b->nevents; i++) {
        ev = &b->events[i];
        hashes += ev->nhashes;

        if (ev->type > KVB_EV_CLEARED) {
            abort();
        }

        if (ev->type == KVB_EV_CLEARED) {
            continue;
        }

        for (j = 0; j < ev->nhashes; j++) {
            if (kvb_engine_hash(&ev->hashes[j], &h) != 0) {
                abort();
            }
        }

        if (ev->type == KVB_EV_REMOVED) {
            continue;
        }

        if (ev->block_size == 0
            || (uint64_t) ev->nhashes * ev->block_size != ev->ntokens)
        {
            abort();
        }

        for (j = 0; j < ev->ntokens; j++) {
            if (ev->tokens[j].type != MSGPACK_OBJECT_POSITIVE_INTEGER
                || ev->tokens[j].via.u64 > UINT32_MAX)
            {
                abort();
            }
        }

        if (ev->extra_keys != NULL
            && ev->extra_keys->via.array.size != ev->nhashes)
        {
            abort();
        }
    }

    if (hashes > lim->max_hashes) {
        abort();
    }
}
