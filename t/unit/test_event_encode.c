/*
 * Unit tests of the KV event encoder (src/core/kva_event_encode.c): its
 * output, the decoder reading it back, and mutations of it.  TAP output.
 */

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "event_gen.h"
#include "kva_rand.h"



#define RT_ROUNDS      5000
#define FUZZ_ROUNDS    20000


/* fixed seed, so a failure reproduces */
static uint64_t  rng = 0x243f6a8885a308d3ULL;


static uint64_t
rnd(void)
{
    return kva_rand_next(&rng);
}


static void
test_encode(void)
{
    char            *s;
    size_t           len;
    uint64_t         hs[3];
    kva_ev_t         ev[3];
    kva_batch_t      b, d;
    kva_event_rc_e   rc;

    memset(&b, 0, sizeof(b));
    memset(ev, 0, sizeof(ev));
    strcpy(b.server, "127.0.0.1:8001");
    b.server_len = 14;
    b.seq = 42;
    hs[0] = 0x9f3c2a0b11d4e5f6ULL;
    hs[1] = 0x0123456789abcdefULL;
    hs[2] = 0x0123456789abcdefULL;
    ev[0].type = KVA_EV_STORED;
    ev[0].has_parent = 1;
    ev[0].parent = 0;
    ev[0].hashes = hs;
    ev[0].nhashes = 2;
    ev[1].type = KVA_EV_REMOVED;
    ev[1].hashes = hs + 2;
    ev[1].nhashes = 1;
    ev[2].type = KVA_EV_CLEARED;
    b.events = ev;
    b.nevents = 3;
    b.has_load = 1;
    b.waiting = 3;
    b.running = 12;
    b.kv_usage = 0.43;

    s = kva_event_encode(&b, &len);
    ok(s != NULL && len == strlen(s) && strcmp(s,
       "{\"v\":1,\"server\":\"127.0.0.1:8001\",\"seq\":42,\"events\":["
       "{\"type\":\"stored\",\"parent\":\"0000000000000000\","
       "\"hashes\":[\"9f3c2a0b11d4e5f6\",\"0123456789abcdef\"]},"
       "{\"type\":\"removed\",\"hashes\":[\"0123456789abcdef\"]},"
       "{\"type\":\"cleared\"}],"
       "\"load\":{\"waiting\":3,\"running\":12,\"kv_usage\":0.43}}") == 0,
       "encode: the documented example, compact");
    free(s);

    b.nevents = 0;
    b.has_load = 0;
    b.snapshot = KVA_SNAP_BEGIN;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"127.0.0.1:8001\","
       "\"seq\":42,\"snapshot\":\"begin\"}") == 0, "encode: snapshot");
    free(s);

    b.snapshot = KVA_SNAP_NONE;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"127.0.0.1:8001\","
       "\"seq\":42}") == 0, "encode: heartbeat");
    free(s);

    strcpy(b.server, "a\"b\\c\n\x01\xc3\xa9");
    b.server_len = strlen(b.server);
    b.has_load = 1;
    b.kv_usage = NAN;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"server\":\"a\\\"b\\\\c\\n"
       "\\u0001\xc3\xa9\",\"seq\":42,\"load\":{\"waiting\":3,\"running\":12,"
       "\"kv_usage\":0}}") == 0, "encode: escapes; NaN kv_usage is 0");

    rc = KVA_EVENT_MALFORMED;

    if (s != NULL) {
        rc = kva_event_decode(s, len, NULL, &d, NULL, 0);
    }

    ok(rc == KVA_EVENT_OK && strcmp(d.server, b.server) == 0,
       "encode: escaped server decodes back");
    kva_batch_free(&d);
    free(s);

    b.nevents = 1;
    ev[0].type = (kva_ev_type_e) 7;
    s = kva_event_encode(&b, &len);
    ok(s == NULL, "encode: unknown type is NULL");
    free(s);
}


static void
test_round_trip(void)
{
    int              i, good, special;
    char            *s;
    size_t           len, k;
    uint64_t        *store;
    kva_batch_t      b, d;
    kva_event_rc_e   rc;

    good = 1;
    special = 0;

    for (i = 0; i < RT_ROUNDS && good; i++) {
        random_batch(&b, &store);
        s = kva_event_encode(&b, &len);

        if (s == NULL || strlen(s) != len) {
            printf("# round %d: encode failed\n", i);
            good = 0;
            break;
        }

        rc = kva_event_decode(s, len, NULL, &d, NULL, 0);

        if (rc != KVA_EVENT_OK || !sane(&d) || !kva_batch_equal(&b, &d)
            || d.heartbeat != b.heartbeat)
        {
            printf("# round %d: rc %d: %s\n", i, rc, s);
            good = 0;
        }

        for (k = 0; k < d.hash_count; k++) {
            special |= d.hash_store[k] == 0;
            special |= (d.hash_store[k] == UINT64_MAX) << 1;
            special |= ((d.hash_store[k] >> 63) != 0) << 2;
        }

        kva_batch_free(&d);
        free(s);
        free(b.events);
        free(store);
    }

    ok(good, "round trip of %d random batches", RT_ROUNDS);
    ok(special == 7, "they included 0, UINT64_MAX and top-bit hashes");
}


static void
test_resync(void)
{
    int       i, good;
    char     *s, server[KVA_EVENT_SERVER_MAX], got[KVA_EVENT_SERVER_MAX];
    size_t    len, n, glen;
    unsigned     rank;
    const char  *m;

    s = kva_event_encode_resync("127.0.0.1:8001", 14, -1, &len);
    ok(s != NULL && len == strlen(s) && strcmp(s,
       "{\"v\":1,\"type\":\"resync\",\"server\":\"127.0.0.1:8001\"}") == 0,
       "resync encode");
    ok(s != NULL
       && kva_event_decode_resync(s, len, got, sizeof(got), &glen, NULL) == 0
       && glen == 14 && strcmp(got, "127.0.0.1:8001") == 0,
       "resync decode");
    ok(s != NULL
       && kva_event_decode_resync(s, len, got, 14, &glen, NULL) != 0,
       "resync decode: server over the caller's buffer");
    free(s);

    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"stored\",\"server\":\"a\""
       "}", 34, got, sizeof(got), &glen, NULL) != 0, "resync: wrong type");
    ok(kva_event_decode_resync("{\"v\":2,\"type\":\"resync\",\"server\":\"a\""
       "}", 34, got, sizeof(got), &glen, NULL) != 0, "resync: v 2");
    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"resync\"}", 23, got,
       sizeof(got), &glen, NULL) != 0, "resync: no server");
    ok(kva_event_decode_resync("{\"v\":1,\"type\":\"resync\",\"server\":\"\"}",
       33, got, sizeof(got), &glen, NULL) != 0, "resync: empty server");
    ok(kva_event_decode_resync("{\"v\":1,", 7, got, sizeof(got), &glen,
       NULL) != 0, "resync: not json");
    ok(kva_event_decode_resync("[1]", 3, got, sizeof(got), &glen, NULL)
       != 0, "resync: array");

    /* a data-parallel server's rank */
    rank = 7;
    s = kva_event_encode_resync("127.0.0.1:8001", 14, -1, &len);
    ok(s != NULL && kva_event_decode_resync(s, len, got, sizeof(got), &glen,
       &rank) == 0 && rank == 0, "resync without a rank asks for rank 0");
    free(s);
    s = kva_event_encode_resync("127.0.0.1:8001", 14, 3, &len);
    ok(s != NULL && strcmp(s, "{\"v\":1,\"type\":\"resync\","
       "\"server\":\"127.0.0.1:8001\",\"rank\":3}") == 0,
       "resync encode with a rank");
    ok(s != NULL && kva_event_decode_resync(s, len, got, sizeof(got), &glen,
       &rank) == 0 && rank == 3, "resync decode with a rank");
    free(s);
    m = "{\"v\":1,\"type\":\"resync\",\"server\":\"a\",\"rank\":1024}";
    ok(kva_event_decode_resync(m, strlen(m), got, sizeof(got), &glen,
       &rank) != 0, "resync: rank 1024 is out of range");
    m = "{\"v\":1,\"type\":\"resync\",\"server\":\"a\",\"rank\":1023}";
    ok(kva_event_decode_resync(m, strlen(m), got, sizeof(got), &glen,
       &rank) == 0 && rank == 1023, "resync: rank 1023 is in range");
    m = "{\"v\":1,\"type\":\"resync\",\"server\":\"a\",\"rank\":\"1\"}";
    ok(kva_event_decode_resync(m, strlen(m), got, sizeof(got), &glen,
       &rank) != 0, "resync: rank as a string");

    good = 1;

    for (i = 0; i < 1000 && good; i++) {
        random_server(server, &n);
        s = kva_event_encode_resync(server, n, -1, &len);

        if (s == NULL
            || kva_event_decode_resync(s, len, got, sizeof(got), &glen, NULL)
               != 0
            || glen != n || memcmp(got, server, n) != 0)
        {
            printf("# %s\n", s ? s : "(null)");
            good = 0;
        }

        free(s);
    }

    ok(good, "resync round trip of servers with quotes, backslashes, "
       "controls, UTF-8");
}


/* random flips, truncations, insertions, deletions of valid messages */
static void
test_fuzz(void)
{
    int                  i, good, k, nok;
    char                *s, *m, err[128];
    size_t               len, mlen, pos, j;
    uint64_t            *store;
    kva_batch_t          b, d;
    kva_event_rc_e       rc;
    kva_event_limits_t   lim;
    static const char    alphabet[] = "{}[]\",:0123456789abcdefvx\\ -.eE";

    lim.max_message = 4096;
    lim.max_hashes = 100;
    lim.max_events = 6;

    good = 1;
    nok = 0;

    for (i = 0; i < FUZZ_ROUNDS; i++) {
        random_batch(&b, &store);
        s = kva_event_encode(&b, &len);
        free(b.events);
        free(store);

        if (s == NULL) {
            abort();
        }

        m = malloc(len + 16);
        if (m == NULL) {
            abort();
        }

        memcpy(m, s, len);
        mlen = len;

        for (k = 1 + rnd() % 4; k > 0; k--) {
            pos = mlen ? rnd() % mlen : 0;

            switch (rnd() % 6) {
            case 0:
                m[pos] = (char) rnd();
                break;
            case 1:
                m[pos] ^= (char) (1 << (rnd() % 8));
                break;
            case 2:
                mlen = pos;
                break;
            case 3:
                if (mlen > 0) {
                    memmove(m + pos, m + pos + 1, mlen - pos - 1);
                    mlen--;
                }
                break;
            default:
                if (mlen < len + 15) {
                    memmove(m + pos + 1, m + pos, mlen - pos);
                    m[pos] = alphabet[rnd() % (sizeof(alphabet) - 1)];
                    mlen++;
                }
            }
        }

        /* exactly sized, so ASan catches a read past the end */
        m = realloc(m, mlen ? mlen : 1);
        if (m == NULL) {
            abort();
        }

        memset(&d, 0x5a, sizeof(d));
        rc = kva_event_decode(m, mlen, i % 2 ? &lim : NULL, &d, err,
                              sizeof(err));

        if (rc == KVA_EVENT_OK) {
            nok++;

            if (!sane(&d)) {
                printf("# round %d: insane batch\n", i);
                good = 0;
            }

            for (j = 0; j < d.hash_count; j++) {
                d.hash_store[j] ^= 1;
            }

        } else if (!zeroed(&d) || err[0] == '\0') {
            printf("# round %d: rc %d, batch not zeroed or no reason\n",
                   i, rc);
            good = 0;
        }

        kva_batch_free(&d);
        free(m);
        free(s);
    }

    ok(good, "fuzz: %d mutated messages, %d still valid, no crash; "
       "failures leave the batch zeroed", FUZZ_ROUNDS, nok);
}


/* the token key space is said; text, the default, is not */

static void
test_keyspace(void)
{
    char            *s;
    size_t           len;
    char             err[128];
    uint64_t         h;
    kva_ev_t         ev;
    kva_batch_t      b, d;
    kva_event_rc_e   rc;

    memset(&b, 0, sizeof(b));
    memset(&ev, 0, sizeof(ev));
    strcpy(b.server, "127.0.0.1:8001");
    b.server_len = 14;
    b.seq = 7;
    h = 0x1122334455667788ULL;
    ev.type = KVA_EV_STORED;
    ev.hashes = &h;
    ev.nhashes = 1;
    b.events = &ev;
    b.nevents = 1;
    b.hash_count = 1;

    s = kva_event_encode(&b, &len);
    ok(s != NULL && strstr(s, "keyspace") == NULL,
       "a text batch does not name its key space");
    free(s);

    b.keyspace = KVA_KEYSPACE_TOKEN_KEYS;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strstr(s, "\"keyspace\":\"tokens\"") != NULL,
       "a token batch says \"keyspace\":\"tokens\"");

    rc = (s != NULL) ? kva_event_decode(s, len, NULL, &d, err, sizeof(err))
                     : KVA_EVENT_NO_MEMORY;
    ok(rc == KVA_EVENT_OK && d.keyspace == KVA_KEYSPACE_TOKEN_KEYS
       && kva_batch_equal(&b, &d), "and decodes to the same batch");

    if (rc == KVA_EVENT_OK) {
        kva_batch_free(&d);
    }

    free(s);

    /* a data-parallel server's rank travels with its batch */
    b.has_rank = 1;
    b.rank = 5;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strstr(s, "\"server\":\"127.0.0.1:8001\",\"rank\":5,")
       != NULL, "a rank's batch says \"rank\":5");

    rc = (s != NULL) ? kva_event_decode(s, len, NULL, &d, err, sizeof(err))
                     : KVA_EVENT_NO_MEMORY;
    ok(rc == KVA_EVENT_OK && d.has_rank && d.rank == 5
       && kva_batch_equal(&b, &d), "and decodes to the same batch");

    if (rc == KVA_EVENT_OK) {
        kva_batch_free(&d);
    }

    free(s);

    /* what another nginx learned says where it comes from */
    b.has_origin = 1;
    b.origin = 0x0123456789abcdefULL;
    s = kva_event_encode(&b, &len);
    ok(s != NULL && strstr(s, "\"origin\":\"0123456789abcdef\"") != NULL,
       "a learned batch names its origin");

    rc = (s != NULL) ? kva_event_decode(s, len, NULL, &d, err, sizeof(err))
                     : KVA_EVENT_NO_MEMORY;
    ok(rc == KVA_EVENT_OK && d.has_origin && d.origin == b.origin
       && kva_batch_equal(&b, &d), "and decodes to the same batch");

    if (rc == KVA_EVENT_OK) {
        kva_batch_free(&d);
    }

    free(s);

    s = strdup("{\"v\":1,\"server\":\"a\",\"origin\":\"xyz\",\"seq\":1}");
    rc = (s != NULL) ? kva_event_decode(s, strlen(s), NULL, &d, err,
                                        sizeof(err))
                     : KVA_EVENT_NO_MEMORY;
    ok(rc == KVA_EVENT_BAD_FIELD && strstr(err, "origin") != NULL,
       "an origin that is not hex is refused: %s", err);
    free(s);

    s = strdup("{\"v\":1,\"server\":\"a\",\"rank\":1024,\"seq\":1}");
    rc = (s != NULL) ? kva_event_decode(s, strlen(s), NULL, &d, err,
                                        sizeof(err))
                     : KVA_EVENT_NO_MEMORY;
    ok(rc == KVA_EVENT_BAD_FIELD && strstr(err, "rank") != NULL,
       "rank 1024 is refused: %s", err);
    free(s);
}


int
main(void)
{
    test_encode();
    test_keyspace();
    test_round_trip();
    test_resync();
    test_fuzz();

    return done_testing();
}
