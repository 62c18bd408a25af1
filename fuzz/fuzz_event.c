/*
 * libFuzzer target: the event decoder (src/core/kva_event.c).
 *
 * Every input is decoded twice, without limits and with limits small
 * enough for the fuzzer's inputs to reach them; a message valid under the
 * limits must be valid without them and decode the same.  A valid batch is
 * encoded, decoded again and compared field by field.  The input is also
 * tried as a resync request, which must survive its own round trip.  Any
 * disagreement aborts.
 *
 *   make build/fuzz/fuzz_event && build/fuzz/fuzz_event fuzz/corpus/event
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kva_event.h"


/* the pre-scan's bounds: 32 + 8 * 4 + 64 = 128 values, 24 containers */
#define FZ_MAX_HASHES  32
#define FZ_MAX_EVENTS  4


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_check_batch(const kva_batch_t *b);
static void fz_round_trip(const kva_batch_t *b);
static void fz_resync(const char *msg, size_t len);


/* the invariants kva_event.h promises of a decoded batch */
static void
fz_check_batch(const kva_batch_t *b)
{
    size_t  i, total;

    if (b->server_len == 0 || b->server_len >= KVA_EVENT_SERVER_MAX
        || b->server[b->server_len] != '\0'
        || memchr(b->server, '\0', b->server_len) != NULL
        || b->seq > (1ULL << 53)
        || b->snapshot > KVA_SNAP_END
        || b->heartbeat != (b->nevents == 0 && b->snapshot == KVA_SNAP_NONE)
        || !(b->kv_usage >= 0.0 && b->kv_usage <= 1.0)
        || (b->nevents == 0) != (b->events == NULL)
        || (b->hash_count == 0) != (b->hash_store == NULL))
    {
        abort();
    }

    total = 0;

    for (i = 0; i < b->nevents; i++) {
        if (b->events[i].type > KVA_EV_CLEARED) {
            abort();
        }

        if (b->events[i].nhashes == 0) {
            continue;
        }

        if (b->events[i].type == KVA_EV_CLEARED
            || b->events[i].hashes != b->hash_store + total)
        {
            abort();
        }

        total += b->events[i].nhashes;
    }

    if (total != b->hash_count) {
        abort();
    }
}


/* what the encoder writes, the decoder reads back unchanged */
static void
fz_round_trip(const kva_batch_t *b)
{
    char            *msg, err[128];
    size_t           len;
    kva_batch_t      d;
    kva_event_rc_e   rc;

    msg = kva_event_encode(b, &len);

    if (msg == NULL) {
        /* only a malloc failure may say no to a decoded batch */
        abort();
    }

    if (strlen(msg) != len) {
        abort();
    }

    rc = kva_event_decode(msg, len, NULL, &d, err, sizeof(err));

    if (rc != KVA_EVENT_OK || !kva_batch_equal(b, &d)) {
        abort();
    }

    kva_batch_free(&d);
    free(msg);
}


static void
fz_resync(const char *msg, size_t len)
{
    char      server[KVA_EVENT_SERVER_MAX], again[KVA_EVENT_SERVER_MAX];
    char     *out;
    size_t    n, m, out_len;
    unsigned  rank, rank2;

    if (kva_event_decode_resync(msg, len, server, sizeof(server), &n, &rank)
        != 0)
    {
        return;
    }

    if (n == 0 || n >= sizeof(server) || server[n] != '\0') {
        abort();
    }

    out = kva_event_encode_resync(server, n, (int) rank, &out_len);

    if (out == NULL) {
        abort();
    }

    if (kva_event_decode_resync(out, out_len, again, sizeof(again), &m,
                                &rank2) != 0
        || m != n || memcmp(server, again, n) != 0 || rank2 != rank
        || rank > KVA_EVENT_RANK_MAX)
    {
        abort();
    }

    free(out);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char                 err[128];
    kva_batch_t          free_b, lim_b;
    kva_event_rc_e       free_rc, lim_rc;
    kva_event_limits_t   lim;

    lim.max_message = 0;
    lim.max_hashes = FZ_MAX_HASHES;
    lim.max_events = FZ_MAX_EVENTS;

    free_rc = kva_event_decode((const char *) data, size, NULL, &free_b,
                               err, sizeof(err));
    lim_rc = kva_event_decode((const char *) data, size, &lim, &lim_b,
                              err, sizeof(err));

    /* limits only ever turn a message away, as too big, whatever else */
    if (lim_rc != free_rc && lim_rc != KVA_EVENT_TOO_BIG) {
        abort();
    }

    if (free_rc == KVA_EVENT_OK) {
        fz_check_batch(&free_b);
        fz_round_trip(&free_b);
    }

    if (lim_rc == KVA_EVENT_OK) {
        if (!kva_batch_equal(&free_b, &lim_b)
            || lim_b.hash_count > FZ_MAX_HASHES
            || lim_b.nevents > FZ_MAX_EVENTS)
        {
            abort();
        }
    }

    kva_batch_free(&free_b);
    kva_batch_free(&lim_b);

    fz_resync((const char *) data, size);

    return 0;
}
