/*
 * kvbridge: its own metrics page, in the Prometheus text format
 * (kvbridge --metrics ADDR).  It renders what the components' stats
 * structs hold, read in one place (kvb_main.c fills a view); a series is
 * one line in a table of kvb_prom.c naming the struct and the field.
 */

#ifndef _KVB_PROM_H_INCLUDED_
#define _KVB_PROM_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kvb_engine.h"
#include "kvb_loop.h"
#include "kvb_redis.h"
#include "kvb_scrape.h"


/* a growable text; failed once an allocation failed (the page is lost) */
typedef struct {
    char                   *data;
    size_t                  len;
    size_t                  cap;
    unsigned                failed:1;
} kvb_buf_t;


/* what the bridge itself keeps of an engine, beside the components */
typedef struct {
    double                  last_event_age; /* seconds; -1: none yet */
    uint64_t                malformed;      /* not [topic, seq, payload] */
    uint64_t                replaying;      /* 1 while a replay runs */
    uint64_t                blocks;         /* in the mirror */
    uint64_t                scrape_failing; /* the last scrape failed */
    uint64_t                vouched;    /* stream alive, in order, rebuilt */
} kvb_prom_bridge_t;


/* the structs an engine's series come from; NULL: not there */
typedef struct {
    const char                 *name;
    unsigned                    rank;
    const kvb_engine_stats_t   *engine;
    const kvb_stream_stats_t   *stream;
    const kvb_mirror_stats_t   *mirror;
    const kvb_scrape_stats_t   *scrape;
    const kvb_prom_bridge_t    *bridge;
} kvb_prom_engine_t;


typedef struct {
    const kvb_prom_engine_t    *engines;
    size_t                      nengines;
    const kvb_redis_stats_t    *redis;
    uint64_t                    redis_up;
    const kvb_loop_t           *loop;
    /* the collector's: refused by the allow list, over a peer's rate */
    uint64_t                    collect_denied;
    uint64_t                    collect_limited;
} kvb_prom_view_t;


void kvb_prom_render(kvb_buf_t *b, const kvb_prom_view_t *v);

void kvb_buf_printf(kvb_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kvb_buf_free(kvb_buf_t *b);


#endif /* _KVB_PROM_H_INCLUDED_ */
