/*
 * Minimal TAP for the core's unit tests: prove reads what these print.
 */

#ifndef _KVA_TAP_H_INCLUDED_
#define _KVA_TAP_H_INCLUDED_


#include <stdio.h>


static int  tap_n, tap_failed;


/* cond is evaluated once: a test may decode or insert inside it */
#define ok(cond, ...)                                                         \
    do {                                                                      \
        int  tap_ok_ = (cond) ? 1 : 0;                                        \
                                                                              \
        tap_n++;                                                              \
        if (!tap_ok_) {                                                       \
            tap_failed++;                                                     \
            printf("not ok %d - ", tap_n);                                    \
        } else {                                                              \
            printf("ok %d - ", tap_n);                                        \
        }                                                                     \
        printf(__VA_ARGS__);                                                  \
        printf("\n");                                                         \
        if (!tap_ok_) {                                                       \
            printf("#   failed at %s line %d: %s\n", __FILE__, __LINE__,     \
                   #cond);                                                    \
        }                                                                     \
    } while (0)


/* a test that cannot run here, counted as passed with the reason */
#define skip(why)                                                             \
    (tap_n++, printf("ok %d # skip %s\n", tap_n, why))


#define done_testing()                                                        \
    (printf("1..%d\n", tap_n), tap_failed ? 1 : 0)


#endif /* _KVA_TAP_H_INCLUDED_ */
