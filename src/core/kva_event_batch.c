/*
 * kv_aware core: a batch of KV events (kva_event.h), what the decoder
 * (kva_event.c) makes of a message and the encoder (kva_event_encode.c)
 * writes one from: its release and its comparison.
 */

#include <stdlib.h>
#include <string.h>

#include "kva_event.h"


void
kva_batch_free(kva_batch_t *b)
{
    if (b == NULL) {
        return;
    }

    free(b->events);
    free(b->hash_store);

    memset(b, 0, sizeof(kva_batch_t));
}


int
kva_batch_equal(const kva_batch_t *a, const kva_batch_t *b)
{
    size_t           i;
    const kva_ev_t  *x, *y;

    if (a->server_len != b->server_len
        || memcmp(a->server, b->server, a->server_len) != 0
        || a->has_rank != b->has_rank || a->rank != b->rank
        || a->has_origin != b->has_origin || a->origin != b->origin
        || a->seq != b->seq || a->snapshot != b->snapshot
        || a->keyspace != b->keyspace || a->heartbeat != b->heartbeat
        || a->has_load != b->has_load
        || a->nevents != b->nevents || a->hash_count != b->hash_count)
    {
        return 0;
    }

    if (a->has_load
        && (a->waiting != b->waiting || a->running != b->running
            || a->kv_usage != b->kv_usage || a->kv_tokens != b->kv_tokens))
    {
        return 0;
    }

    for (i = 0; i < a->nevents; i++) {
        x = &a->events[i];
        y = &b->events[i];

        if (x->type != y->type || x->nhashes != y->nhashes
            || x->has_parent != y->has_parent || x->tier != y->tier
            || (x->has_parent && x->parent != y->parent)
            || (x->nhashes > 0
                && memcmp(x->hashes, y->hashes,
                          x->nhashes * sizeof(uint64_t)) != 0))
        {
            return 0;
        }
    }

    return 1;
}
