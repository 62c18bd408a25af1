/*
 * What a hostile event message costs the subscriber: the pre-scan's speed
 * (kva_event_shape(), a full pass) over 4 MB of hashes and over 4 MB of
 * "{}," and the time and resident memory of kva_event_decode() on a 4 MB
 * message whose ignored field holds [{},{},...], under the limits the
 * module used to set (max_events = max_hashes = 65536) and under the
 * proposed ones.  Median of RUNS.
 *
 *   make $PWD/build/bench_event_cost && build/bench_event_cost
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kva_event.h"
#include "kva_proc.h"


#define RUNS      9
#define MSG_SIZE  (4 * 1024 * 1024)


static char *make_message(const char *item, size_t *len);
static double scan_mbs(const char *msg, size_t len);
static void decode_hostile(const char *name, const char *msg, size_t len,
    const kva_event_limits_t *lim);


static volatile size_t  sink;


/* {"v":1,"server":"a","seq":1,"x":[item,item,...]}, about MSG_SIZE */
static char *
make_message(const char *item, size_t *len)
{
    char    *msg, *p;
    size_t   n;

    msg = malloc(MSG_SIZE + 64);
    if (msg == NULL) {
        exit(1);
    }

    n = strlen(item);
    p = msg + sprintf(msg, "{\"v\":1,\"server\":\"a\",\"seq\":1,\"x\":[%s",
                      item);

    while ((size_t) (p - msg) + n + 1 < MSG_SIZE) {
        *p++ = ',';
        memcpy(p, item, n);
        p += n;
    }

    strcpy(p, "]}");
    *len = (p - msg) + 2;

    return msg;
}


static double
scan_mbs(const char *msg, size_t len)
{
    int                 r;
    double              rates[RUNS];
    long long           t;
    kva_event_shape_t   max, s;

    memset(&max, 0, sizeof(max));

    for (r = 0; r < RUNS; r++) {
        t = bench_now_ns();
        kva_event_shape(msg, len, &max, &s);
        t = bench_now_ns() - t;
        sink += s.values;
        rates[r] = (double) len / 1e6 / ((double) t / 1e9);
    }

    qsort(rates, RUNS, sizeof(double), bench_cmp_double);

    return rates[RUNS / 2];
}


static void
decode_hostile(const char *name, const char *msg, size_t len,
    const kva_event_limits_t *lim)
{
    int              r;
    char             err[128];
    long             before;
    double           ms[RUNS];
    long long        t;
    kva_batch_t      b;
    kva_event_rc_e   rc;

    before = kva_rss_kb();
    rc = KVA_EVENT_OK;

    for (r = 0; r < RUNS; r++) {
        t = bench_now_ns();
        rc = kva_event_decode(msg, len, lim, &b, err, sizeof(err));
        ms[r] = (double) (bench_now_ns() - t) / 1e6;
        kva_batch_free(&b);
    }

    qsort(ms, RUNS, sizeof(double), bench_cmp_double);

    printf("%-34s %9.2f ms  rss %6ld -> %6ld kB  %s%s%s\n", name,
           ms[RUNS / 2], before, kva_rss_kb(), kva_event_strerror(rc),
           rc ? ": " : "", rc ? err : "");
}


int
main(void)
{
    char                *hostile, *hashes;
    size_t               hlen, slen;
    kva_event_limits_t   old, proposed, none;

    hostile = make_message("{}", &hlen);
    hashes = make_message("\"0123456789abcdef\"", &slen);

    printf("pre-scan, 4 MB of hex strings:  %8.0f MB/s\n",
           scan_mbs(hashes, slen));
    printf("pre-scan, 4 MB of {},{},...:    %8.0f MB/s\n",
           scan_mbs(hostile, hlen));

    old.max_message = MSG_SIZE;
    old.max_hashes = 65536;
    old.max_events = 65536;

    proposed.max_message = 256 * 1024;
    proposed.max_hashes = 4096;
    proposed.max_events = 1024;

    /* max_message alone is what stops it under the proposed limits */
    none = proposed;
    none.max_message = 0;

    decode_hostile("hostile 4 MB, limits 4m/65536", hostile, hlen, &old);
    decode_hostile("hostile 4 MB, 4096/1024", hostile, hlen, &none);
    decode_hostile("hostile 4 MB, no limits", hostile, hlen, NULL);

    free(hostile);
    free(hashes);

    return 0;
}
