/*
 * kvbridge: an engine's load (requests running and waiting, KV cache
 * usage), scraped from its Prometheus /metrics.
 *
 * Three parts, the first two pure:
 *
 *   kvb_metrics_parse() reads the text exposition format 0.0.4 and picks
 *   out vLLM's and SGLang's load gauges;
 *
 *   kvb_chunked_decode() undoes HTTP/1.1 chunked transfer coding
 *   incrementally, in place (uvicorn, vLLM's server, sends /metrics
 *   chunked);
 *
 *   kvb_scrape_*() is a non-blocking HTTP/1.1 GET of one URL, driven by
 *   the bridge's zmq_poll() loop: want() gives the fd and events to poll,
 *   io() makes progress, deadline() says when to call again without I/O.
 *   One connection a scrape, "Connection: close".  The host must be an
 *   IPv4 or IPv6 literal or "localhost": a name lookup would block the
 *   loop, so there is none.
 */

#ifndef _KVB_METRICS_H_INCLUDED_
#define _KVB_METRICS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


/* a longer line is skipped whole: no real sample comes near it */
#define KVB_METRICS_LINE_MAX   (64 * 1024)

/* vLLM's /metrics is 50-300 KB (histograms per model); past this, fail */
#define KVB_SCRAPE_BODY_MAX    (4 * 1024 * 1024)
#define KVB_SCRAPE_HEADER_MAX  (16 * 1024)


typedef struct {
    uint32_t  waiting;
    uint32_t  running;
    double    kv_usage;           /* fraction in [0, 1] */
    unsigned  have_waiting:1;
    unsigned  have_running:1;
    unsigned  have_usage:1;
} kvb_load_t;


/*
 * Series of one name (an engine or a model each) are added up, usage is
 * their maximum, clamped to [0, 1]; counts saturate at UINT32_MAX.
 * Negative and NaN samples are ignored.  Returns 0 if any of the three
 * was found, -1 otherwise.  Reads text[0, len) only, allocates nothing.
 */
int kvb_metrics_parse(const char *text, size_t len, kvb_load_t *load);


typedef enum {
    KVB_CHUNKED_MORE = 0,       /* all input used, the body goes on */
    KVB_CHUNKED_DONE,           /* the last chunk and trailers are read */
    KVB_CHUNKED_ERROR
} kvb_chunked_rc_e;

typedef struct {
    uint64_t  size;             /* the chunk's size, then its bytes left */
    unsigned  state;
    unsigned  digits;
} kvb_chunked_t;


void kvb_chunked_init(kvb_chunked_t *c);

/*
 * Decodes in[0, len) and writes the data to out; out may be in itself or
 * any place before it (data never outruns its encoding).  *out_len
 * receives the bytes written, *used the bytes read: len, except after
 * DONE, where the bytes past the body are left.
 */
kvb_chunked_rc_e kvb_chunked_decode(kvb_chunked_t *c, const char *in,
    size_t len, char *out, size_t *out_len, size_t *used);


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
void kvb_scrape_stats(const kvb_scrape_t *s, kvb_scrape_stats_t *st);


#endif /* _KVB_METRICS_H_INCLUDED_ */
