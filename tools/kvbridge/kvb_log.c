/*
 * kvbridge: log lines and the limiter (kvb_log.h).
 */

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "kvb_log.h"


kvb_log_level_e  kvb_log_level = KVB_LOG_INFO;

static const char  *kvb_log_names[] = { "error", "warn", "info", "debug" };


static void kvb_vlog(kvb_log_level_e level, uint64_t suppressed,
    const char *fmt, va_list args);


void
kvb_log(kvb_log_level_e level, const char *fmt, ...)
{
    va_list  args;

    va_start(args, fmt);
    kvb_vlog(level, 0, fmt, args);
    va_end(args);
}


void
kvb_log_limited(kvb_log_limit_t *lim, uint64_t now_ms, kvb_log_level_e level,
    const char *fmt, ...)
{
    va_list  args;

    if (now_ms < lim->next_ms) {
        lim->suppressed++;
        return;
    }

    va_start(args, fmt);
    kvb_vlog(level, lim->suppressed, fmt, args);
    va_end(args);

    lim->next_ms = now_ms + KVB_LOG_EVERY_MS;
    lim->suppressed = 0;
}


uint64_t
kvb_now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}


static void
kvb_vlog(kvb_log_level_e level, uint64_t suppressed, const char *fmt,
    va_list args)
{
    char        stamp[32];
    time_t      now;
    struct tm   tm;

    if (level > kvb_log_level) {
        return;
    }

    now = time(NULL);
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);

    fprintf(stderr, "%s kvbridge %s: ", stamp, kvb_log_names[level]);
    vfprintf(stderr, fmt, args);

    if (suppressed) {
        fprintf(stderr, " (and %llu more like it)",
                (unsigned long long) suppressed);
    }

    fputc('\n', stderr);
}
