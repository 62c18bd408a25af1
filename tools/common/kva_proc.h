/*
 * What the tests and benchmarks read about their own process from /proc:
 * the resident set, to show that a hostile input leaves memory flat.
 */

#ifndef _KVA_PROC_H_INCLUDED_
#define _KVA_PROC_H_INCLUDED_


#include <stdio.h>
#include <unistd.h>


/* resident set size in KiB, or -1 where /proc cannot tell */

static inline long
kva_rss_kb(void)
{
    long   size, resident;
    FILE  *f;

    f = fopen("/proc/self/statm", "r");
    if (f == NULL) {
        return -1;
    }

    if (fscanf(f, "%ld %ld", &size, &resident) != 2) {
        fclose(f);
        return -1;
    }

    fclose(f);

    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}


#endif /* _KVA_PROC_H_INCLUDED_ */
