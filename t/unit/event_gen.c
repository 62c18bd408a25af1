/*
 * What the event codec's unit tests share: random batches, decoding from
 * exactly-sized heap copies (so that ASan sees any overread), the
 * invariants of a decoded batch.  Nothing here prints: tap.h's counters
 * are each test's own.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event_gen.h"
#include "kva_rand.h"


/* fixed seed, so a failure reproduces */
static uint64_t  event_rng = 0x9e3779b97f4a7c15ULL;


static uint64_t
rnd(void)
{
    return kva_rand_next(&event_rng);
}


int
zeroed(const kva_batch_t *b)
{
    kva_batch_t  z;

    memset(&z, 0, sizeof(z));

    return memcmp(&z, b, sizeof(z)) == 0;
}


/* decodes from an exactly-sized heap copy, so ASan sees any overread */
kva_event_rc_e
dec(const char *msg, const kva_event_limits_t *lim, kva_batch_t *b,
    char *err)
{
    char            *copy, dummy[128];
    size_t           len;
    kva_event_rc_e   rc;

    len = strlen(msg);
    copy = malloc(len ? len : 1);

    if (copy == NULL) {
        abort();
    }

    memcpy(copy, msg, len);
    rc = kva_event_decode(copy, len, lim, b, err ? err : dummy, 128);
    free(copy);

    return rc;
}


/* the invariants of a decoded batch */
int
sane(const kva_batch_t *b)
{
    size_t  i, total;

    if (b->server_len == 0 || b->server_len >= KVA_EVENT_SERVER_MAX
        || strlen(b->server) != b->server_len
        || b->seq > (1ULL << 53))
    {
        return 0;
    }

    if ((b->nevents == 0) != (b->events == NULL)
        || (b->hash_count == 0) != (b->hash_store == NULL)
        || b->heartbeat != (b->nevents == 0 && b->snapshot == KVA_SNAP_NONE)
        || !(b->kv_usage >= 0.0 && b->kv_usage <= 1.0))
    {
        return 0;
    }

    total = 0;

    for (i = 0; i < b->nevents; i++) {
        if (b->events[i].nhashes == 0) {
            continue;
        }

        if (b->events[i].hashes != b->hash_store + total) {
            return 0;
        }

        total += b->events[i].nhashes;
    }

    return total == b->hash_count;
}


/* whole UTF-8 sequences, JSON specials and controls, never NUL */
void
random_server(char *s, size_t *len)
{
    size_t              n, want, t;
    const char  *pieces[] = {
        "a", "z", "0", ".", ":", "-", "\"", "\\", "/", "\n", "\t", "\x01",
        "\x1f", "\x7f", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", " "
    };

    want = 1 + rnd() % (KVA_EVENT_SERVER_MAX - 1);
    n = 0;

    do {
        t = rnd() % (sizeof(pieces) / sizeof(pieces[0]));

        if (n + strlen(pieces[t]) > want) {
            break;
        }

        memcpy(s + n, pieces[t], strlen(pieces[t]));
        n += strlen(pieces[t]);
    } while (n < want);

    if (n == 0) {
        s[n++] = 'x';
    }

    s[n] = '\0';
    *len = n;
}


uint64_t
random_hash(void)
{
    switch (rnd() % 8) {
    case 0:
        return 0;
    case 1:
        return UINT64_MAX;
    case 2:
        return rnd() | (1ULL << 63);
    case 3:
        return rnd() >> (rnd() % 64);
    default:
        return rnd();
    }
}


void
random_batch(kva_batch_t *b, uint64_t **store)
{
    size_t     i, k, n, total;
    kva_ev_t  *ev;

    memset(b, 0, sizeof(kva_batch_t));
    random_server(b->server, &b->server_len);

    switch (rnd() % 4) {
    case 0:
        b->seq = 0;
        break;
    case 1:
        b->seq = 1ULL << 53;
        break;
    default:
        b->seq = rnd() >> 11;
    }

    b->snapshot = (kva_snap_e) (rnd() % 5);

    if (rnd() % 2) {
        b->has_load = 1;
        b->waiting = (uint32_t) rnd();
        b->running = rnd() % 3 ? (uint32_t) (rnd() % 100) : UINT32_MAX;

        switch (rnd() % 4) {
        case 0:
            b->kv_usage = (double) (rnd() % 2);
            break;
        case 1:
            b->kv_usage = (double) (rnd() % 1000) / 1000.0;
            break;
        default:
            b->kv_usage = (double) (rnd() >> 11) / (double) (1ULL << 53);
        }
    }

    n = rnd() % 4 ? rnd() % 8 : 0;
    b->nevents = n;
    b->events = n ? calloc(n, sizeof(kva_ev_t)) : NULL;
    *store = malloc(8 * 40 * (n + 1));

    if ((n && b->events == NULL) || *store == NULL) {
        abort();
    }

    total = 0;

    for (i = 0; i < n; i++) {
        ev = &b->events[i];
        ev->type = (kva_ev_type_e) (rnd() % 3);

        if (ev->type == KVA_EV_CLEARED) {
            continue;
        }

        ev->nhashes = rnd() % 41;
        ev->hashes = *store + total;
        total += ev->nhashes;

        for (k = 0; k < ev->nhashes; k++) {
            ev->hashes[k] = random_hash();
        }

        if (ev->type == KVA_EV_STORED && rnd() % 2) {
            ev->has_parent = 1;
            ev->parent = random_hash();
        }
    }

    b->hash_count = total;
    b->heartbeat = (n == 0 && b->snapshot == KVA_SNAP_NONE);
}


/* {"v":1,"server":"s","seq":1,"x":[item,item,...]}: n items, 5 + n values */
char *
filler(const char *item, size_t n, size_t *len)
{
    char    *msg, *p;
    size_t   i, k;

    k = strlen(item);
    msg = malloc(64 + n * (k + 1));

    if (msg == NULL) {
        abort();
    }

    p = msg + sprintf(msg, "{" HDR ",\"x\":[");

    for (i = 0; i < n; i++) {
        if (i > 0) {
            *p++ = ',';
        }

        memcpy(p, item, k);
        p += k;
    }

    strcpy(p, "]}");
    *len = (p - msg) + 2;

    return msg;
}


kva_event_rc_e
dec_len(const char *msg, size_t len, const kva_event_limits_t *lim,
    kva_batch_t *b, char *err)
{
    char            *copy;
    kva_event_rc_e   rc;

    copy = malloc(len);

    if (copy == NULL) {
        abort();
    }

    memcpy(copy, msg, len);
    rc = kva_event_decode(copy, len, lim, b, err, 128);
    free(copy);

    return rc;
}
