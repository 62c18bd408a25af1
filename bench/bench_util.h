/*
 * What the in-process benchmarks share: a monotonic clock and a
 * comparison for medians.
 */

#ifndef _KVA_BENCH_UTIL_H_INCLUDED_
#define _KVA_BENCH_UTIL_H_INCLUDED_


#include <time.h>


static inline long long
bench_now_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (long long) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}


static inline int
bench_cmp_double(const void *a, const void *b)
{
    double  x, y;

    x = *(const double *) a;
    y = *(const double *) b;

    return (x > y) - (x < y);
}


#endif /* _KVA_BENCH_UTIL_H_INCLUDED_ */
