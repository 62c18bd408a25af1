/*
 * Event codec throughput: block hashes per second through
 * kva_event_decode() and kva_event_encode(), for messages of 1, 16, 64 and
 * 256 hashes (one "stored" event with a parent, and a load), median of
 * RUNS timed runs of RUN_NS each.
 *
 * kva_event_encode.c gives the numbers of the hand-written encoder it
 * replaced.
 *
 *   make $PWD/build/bench_event && build/bench_event
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kva_event.h"
#include "kva_rand.h"


#define RUNS     7
#define RUN_NS   200000000LL


typedef size_t (*bench_fn)(const kva_batch_t *b, const char *msg,
    size_t len);


static double measure(bench_fn fn, const kva_batch_t *b, const char *msg,
    size_t len);
static size_t run_decode(const kva_batch_t *b, const char *msg, size_t len);
static size_t run_encode(const kva_batch_t *b, const char *msg, size_t len);


static volatile size_t  sink;




/* the median over RUNS of messages per second */
static double
measure(bench_fn fn, const kva_batch_t *b, const char *msg, size_t len)
{
    int         r;
    double      rates[RUNS];
    long long   start, t, n;

    for (r = 0; r < RUNS; r++) {
        start = bench_now_ns();
        n = 0;

        do {
            fn(b, msg, len);
            n++;

            t = (n & 63) ? 0 : bench_now_ns() - start;
        } while (t < RUN_NS);

        rates[r] = (double) n * 1e9 / (double) t;
    }

    qsort(rates, RUNS, sizeof(double), bench_cmp_double);

    return rates[RUNS / 2];
}


static size_t
run_decode(const kva_batch_t *b, const char *msg, size_t len)
{
    char             err[128];
    size_t           n;
    kva_batch_t      d;
    kva_event_rc_e   rc;

    rc = kva_event_decode(msg, len, NULL, &d, err, sizeof(err));

    if (rc != KVA_EVENT_OK) {
        fprintf(stderr, "decode: %s\n", err);
        exit(1);
    }

    n = d.hash_count;
    sink += d.hash_store[n - 1];
    kva_batch_free(&d);

    return n;
}


static size_t
run_encode(const kva_batch_t *b, const char *msg, size_t len)
{
    char    *s;
    size_t   n;

    s = kva_event_encode(b, &n);

    if (s == NULL) {
        exit(1);
    }

    sink += n;
    free(s);

    return n;
}


int
main(void)
{
    int           i;
    char         *msg;
    size_t        len, k, n;
    double        dec, enc;
    uint64_t      hashes[256], x;
    kva_ev_t      ev;
    kva_batch_t   b;
    static const size_t  sizes[] = { 1, 16, 64, 256 };

    x = 0x6b76612d74657874ULL;

    for (k = 0; k < 256; k++) {
        hashes[k] = kva_rand_next(&x);
    }

    printf("%8s %8s %14s %14s %14s %14s\n", "hashes", "bytes",
           "decode msg/s", "decode hash/s", "encode msg/s",
           "encode hash/s");

    for (i = 0; i < 4; i++) {
        n = sizes[i];

        memset(&b, 0, sizeof(b));
        memset(&ev, 0, sizeof(ev));
        strcpy(b.server, "127.0.0.1:8001");
        b.server_len = strlen(b.server);
        b.seq = 123456789;
        b.has_load = 1;
        b.waiting = 3;
        b.running = 12;
        b.kv_usage = 0.43;
        ev.type = KVA_EV_STORED;
        ev.has_parent = 1;
        ev.parent = 0x0123456789abcdefULL;
        ev.hashes = hashes;
        ev.nhashes = n;
        b.events = &ev;
        b.nevents = 1;

        msg = kva_event_encode(&b, &len);
        if (msg == NULL) {
            return 1;
        }

        dec = measure(run_decode, &b, msg, len);
        enc = measure(run_encode, &b, msg, len);

        printf("%8zu %8zu %14.0f %14.0f %14.0f %14.0f\n", n, len, dec,
               dec * n, enc, enc * n);

        free(msg);
    }

    return 0;
}
