/*
 * kvbridge: a non-blocking HTTP/1.1 GET of one URL, driven by the
 * bridge's zmq_poll() loop: want() gives the fd and events to poll, io()
 * makes progress, deadline() says when to call again without I/O.  One
 * connection a scrape, "Connection: close".  The host must be an IPv4 or
 * IPv6 literal or "localhost": a name lookup would block the loop, so
 * there is none.
 */

#ifndef _KVB_SCRAPE_H_INCLUDED_
#define _KVB_SCRAPE_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include "kvb_chunked.h"
#include "kvb_metrics.h"


/* vLLM's /metrics is 50-300 KB (histograms per model); past this, fail */
#define KVB_SCRAPE_BODY_MAX    (4 * 1024 * 1024)
#define KVB_SCRAPE_HEADER_MAX  (16 * 1024)


typedef struct kvb_scrape_s  kvb_scrape_t;

typedef struct {
    uint64_t     ok;
    uint64_t     failed;
    const char  *last_error;    /* why the last failure failed, or "" */
    unsigned     last_failed:1; /* the most recent scrape failed */
} kvb_scrape_stats_t;


/*
 * url: "http://host[:port][/path]", host an IPv4 address, "[IPv6]" or
 * "localhost"; the port defaults to 80, the path to "/metrics".  A
 * scrape starts interval_ms after the previous one started (or ended,
 * if it ran longer) and fails after timeout_ms.  NULL with err on a bad
 * URL or no memory.
 */
kvb_scrape_t *kvb_scrape_create(const char *url, unsigned interval_ms,
    unsigned timeout_ms, char *err, size_t errlen);
void kvb_scrape_destroy(kvb_scrape_t *s);

/*
 * The fd to poll and *events (ZMQ_POLLIN or ZMQ_POLLOUT), or -1 when
 * idle; starts a scrape when one is due and fails one past its timeout.
 */
int kvb_scrape_want(kvb_scrape_t *s, uint64_t now_ms, short *events);

/* after zmq_poll(): revents of the fd, or 0 when only time passed */
void kvb_scrape_io(kvb_scrape_t *s, short revents, uint64_t now_ms);

/* when want() or io() must run even if the fd stays quiet */
uint64_t kvb_scrape_deadline(const kvb_scrape_t *s);

/* the last good load and when it was taken; -1 if none yet */
int kvb_scrape_load(const kvb_scrape_t *s, kvb_load_t *load,
    uint64_t *taken_ms);
/* one data-parallel rank's (kvb_metrics_parse_ranks()); -1 if none */
int kvb_scrape_rank_load(const kvb_scrape_t *s, unsigned rank,
    kvb_load_t *load, uint64_t *taken_ms);
void kvb_scrape_stats(const kvb_scrape_t *s, kvb_scrape_stats_t *st);


#endif /* _KVB_SCRAPE_H_INCLUDED_ */
