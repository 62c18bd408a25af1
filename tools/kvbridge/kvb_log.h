/*
 * kvbridge: log lines on stderr (journald and container runtimes take
 * them from there), and a limiter so that a stream of bad input costs one
 * line every few seconds, with the count of what it did not print.
 */

#ifndef _KVB_LOG_H_INCLUDED_
#define _KVB_LOG_H_INCLUDED_


#include <stdint.h>


typedef enum {
    KVB_LOG_ERR = 0,
    KVB_LOG_WARN,
    KVB_LOG_INFO,
    KVB_LOG_DEBUG
} kvb_log_level_e;


typedef struct {
    uint64_t                next_ms;
    uint64_t                suppressed;
} kvb_log_limit_t;


#define KVB_LOG_EVERY_MS  5000


extern kvb_log_level_e  kvb_log_level;


void kvb_log(kvb_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* as kvb_log(), at most once every KVB_LOG_EVERY_MS per limiter */
void kvb_log_limited(kvb_log_limit_t *lim, uint64_t now_ms,
    kvb_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

uint64_t kvb_now_ms(void);


#endif /* _KVB_LOG_H_INCLUDED_ */
