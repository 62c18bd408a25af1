/*
 * Unit tests of the KV event decoder's limits (src/core/kva_event.c): the
 * pre-scan, amplification, memory given back.  TAP output.
 */

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "event_gen.h"
#include "kva_proc.h"


static void
test_shape(void)
{
    const char          *m;
    kva_event_shape_t    none, s;

    memset(&none, 0, sizeof(none));

    m = "{\"a\":[1,2,{\"b\":\"[,]\"}],\"c\":{}, \"d\" : [ ] }";
    ok(kva_event_shape(m, strlen(m), &none, &s) == 0 && s.values == 8
       && s.containers == 5 && s.depth == 3,
       "shape: values %zu, containers %zu, depth %zu", s.values,
       s.containers, s.depth);

    /* an escaped quote does not end the string; an escaped backslash does */
    m = "[\"\\\",{[\",\"\\\\\",{}]";
    ok(kva_event_shape(m, strlen(m), &none, &s) == 0 && s.values == 4
       && s.containers == 2 && s.depth == 2,
       "shape: escapes, brackets and commas in strings count for nothing");

    m = "[[[[]]]]";
    s.depth = 0;
    none.depth = 3;
    ok(kva_event_shape(m, strlen(m), &none, &s) == -1 && s.depth == 4,
       "shape: stops at the first level over the bound");
}


static void
test_amplification(void)
{
    int                  i;
    char                 err[128], msg[1024], *m;
    size_t               len, n;
    kva_batch_t          b;
    kva_event_rc_e       rc;
    kva_event_limits_t   lim;

    /* the reported message: a 4 MB heartbeat with [{},{},...] ignored */
    m = filler("{}", (4 * 1024 * 1024 - 64) / 3, &len);
    lim.max_message = 4 * 1024 * 1024;
    lim.max_hashes = 65536;
    lim.max_events = 65536;
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b),
       "hostile [{},{},...] heartbeat of %zu bytes: too big (%s)", len, err);
    ok(kva_event_decode_resync(m, len, msg, sizeof(msg), NULL, NULL) == -1,
       "the same as a resync request: rejected");
    free(m);

    /* the same count of scalars is as big: values, not just containers */
    m = filler("0", (4 * 1024 * 1024 - 64) / 2, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && strstr(err, "values") != NULL,
       "hostile [0,0,...] heartbeat: too big (%s)", err);
    free(m);

    /* exactly at each bound, and one over */
    lim.max_message = 0;
    lim.max_hashes = 100;
    lim.max_events = 10;
    n = lim.max_hashes + KVA_EVENT_VALUES_PER_EVENT * lim.max_events
        + KVA_EVENT_VALUES_ENVELOPE;

    m = filler("0", n - 5, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.heartbeat, "%zu values: at the bound", n);
    kva_batch_free(&b);
    free(m);

    m = filler("0", n - 4, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b), "%zu values: over (%s)",
       n + 1, err);
    free(m);

    n = KVA_EVENT_CONTAINERS_PER_EVENT * lim.max_events
        + KVA_EVENT_CONTAINERS_ENVELOPE;

    m = filler("[]", n - 2, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_OK, "%zu objects and arrays: at the bound", n);
    kva_batch_free(&b);
    free(m);

    m = filler("{}", n - 1, &len);
    rc = dec_len(m, len, &lim, &b, err);
    ok(rc == KVA_EVENT_TOO_BIG && zeroed(&b),
       "%zu objects and arrays: over (%s)", n + 1, err);
    free(m);

    /* a full message at its limits passes the scan */
    lim.max_hashes = 3;
    lim.max_events = 3;
    strcpy(msg, "{" HDR ",\"snapshot\":\"full\",\"keyspace\":\"text\","
           "\"events\":[{\"type\":\"cleared\"},"
           "{\"type\":\"stored\",\"parent\":" H ",\"hashes\":[" H "," H "]},"
           "{\"type\":\"removed\",\"hashes\":[" H "]}],"
           "\"load\":{\"waiting\":1,\"running\":2,\"kv_usage\":0.5}}");
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.nevents == 3 && b.hash_count == 3,
       "every field, at max_hashes and max_events: ok");
    kva_batch_free(&b);

    /* the protocol nests 4 deep; the bound allows 8, with or without limits */
    for (i = 8; i <= 9; i++) {
        n = sprintf(msg, "{" HDR ",\"x\":");
        memset(msg + n, '[', i - 1);
        memset(msg + n + i - 1, ']', i - 1);
        strcpy(msg + n + 2 * (i - 1), "}");
        rc = dec(msg, NULL, &b, err);
        ok(i == 8 ? rc == KVA_EVENT_OK
                  : rc == KVA_EVENT_TOO_BIG && zeroed(&b),
           "nested %d deep: %s (%s)", i, i == 8 ? "ok" : "too big", err);
        kva_batch_free(&b);
    }

    /* strings full of JSON syntax are not counted: they would be here */
    lim.max_hashes = 1;
    lim.max_events = 1;
    strcpy(msg, "{\"v\":1,\"server\":\"[{,\\\"}]\\\\,[\",\"seq\":1,"
           "\"events\":[{\"type\":\"stored\",\"hashes\":[" H "]}],"
           "\"pad\":\"");
    for (i = 0; i < 70; i++) {
        strcat(msg, "[{,");
    }

    strcat(msg, "\"}");
    rc = dec(msg, &lim, &b, err);
    ok(rc == KVA_EVENT_OK && b.server_len == 9
       && memcmp(b.server, "[{,\"}]\\,[", 9) == 0,
       "brackets, commas and escaped quotes in strings: decoded (%s)", err);
    kva_batch_free(&b);
}


/*
 * A big message builds a tree of hundreds of megabytes; the worker keeps
 * allocating meanwhile (pinned here), so glibc does not shrink the heap by
 * itself.  After every decode the freed pages must be back with the
 * system: without the trim the resident set stays at the tree's size.
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVA_ASAN  1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVA_ASAN  1
#endif


static void
test_memory(void)
{
    int           i;
    long          before, worst, now;
    char          err[128], *m;
    size_t        len;
    void         *pin[4];
    kva_batch_t   b;

#ifdef KVA_ASAN
    /* ASan's allocator keeps freed memory in quarantine: nothing to see */
    skip("the resident set means nothing under ASan");
    return;
#endif

    m = filler("{\"k\":[]}", 512 * 1024, &len);
    before = kva_rss_kb();
    worst = before;

    for (i = 0; i < 4; i++) {
        if (dec_len(m, len, NULL, &b, err) != KVA_EVENT_OK) {
            break;
        }

        kva_batch_free(&b);
        pin[i] = malloc(64);
        now = kva_rss_kb();
        worst = now > worst ? now : worst;
    }

    ok(i == 4 && worst - before < 32 * 1024,
       "4 decodes of a %zu byte message: rss %ld kB, %ld at most after one",
       len, before, worst);

    while (i-- > 0) {
        free(pin[i]);
    }

    free(m);
}


int
main(void)
{
    test_shape();
    test_amplification();
    test_memory();

    return done_testing();
}
