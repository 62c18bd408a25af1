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

/* why a scrape failed: each kind is counted and logged on its own */
typedef enum {
    KVB_SCRAPE_ERR_CONNECT = 0, /* refused, unreachable, reset */
    KVB_SCRAPE_ERR_TIMEOUT,
    KVB_SCRAPE_ERR_STATUS,      /* an HTTP status other than 200 */
    KVB_SCRAPE_ERR_ENCODING,    /* gzip, or a transfer coding not chunked */
    KVB_SCRAPE_ERR_PARSE,       /* not HTTP, bad chunks, no load metric */
    KVB_SCRAPE_ERR_CLOSED,      /* closed before the response ended */
    KVB_SCRAPE_ERR_SIZE,        /* headers or body over their caps */
    KVB_SCRAPE_ERR_OTHER,       /* socket(), send(), out of memory */
    KVB_SCRAPE_ERR_KINDS
} kvb_scrape_err_e;

typedef struct {
    uint64_t     ok;
    uint64_t     failed;
    uint64_t     failures[KVB_SCRAPE_ERR_KINDS];    /* failed, by kind */
    const char  *last_error;    /* why the last failure failed, or "" */
    unsigned     last_failed:1; /* the most recent scrape failed */
    unsigned     last_kind;     /* its kvb_scrape_err_e */
    unsigned     last_status;   /* the last HTTP status heard, 0: none */
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
 * Whose metrics these are, for the log (the string must outlive s): a
 * failure is logged with it and the URL, once every few seconds a kind.
 * NULL s: nothing.
 */
void kvb_scrape_label(kvb_scrape_t *s, const char *engine);

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

/* "connect", "timeout", "status", ...: a metrics label for the kind */
const char *kvb_scrape_err_name(unsigned kind);

/*
 * The client past recv(), for the fuzz target: feed_start() starts a
 * scrape with no socket, as if connected and the request sent; feed()
 * gives it bytes as recv() would, in pieces of any size; feed_eof() is
 * the server's close.  feed() returns 1 while the scrape reads on, 0 once
 * it has ended (done or failed, see the stats), -1 if the client had no
 * room for a byte it must take (a bug).
 */
void kvb_scrape_feed_start(kvb_scrape_t *s, uint64_t now_ms);
int kvb_scrape_feed(kvb_scrape_t *s, const char *p, size_t n,
    uint64_t now_ms);
void kvb_scrape_feed_eof(kvb_scrape_t *s, uint64_t now_ms);


#endif /* _KVB_SCRAPE_H_INCLUDED_ */
