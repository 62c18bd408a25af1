/*
 * kvbridge: a tiny HTTP/1.x listener for its metrics page, driven by the
 * bridge's loop.  Non-blocking throughout: a request is read up to
 * KVB_HTTP_REQUEST_MAX bytes, answered once, and the connection closed;
 * at most KVB_HTTP_CONNS at a time, each given KVB_HTTP_TIMEOUT_MS.
 * GET /metrics (or /) gets the page, anything else 404 or 405.
 */

#ifndef _KVB_HTTP_H_INCLUDED_
#define _KVB_HTTP_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "kvb_prom.h"


#define KVB_HTTP_CONNS        8
#define KVB_HTTP_REQUEST_MAX  4096
#define KVB_HTTP_TIMEOUT_MS   5000


typedef struct kvb_http_s  kvb_http_t;

/* renders the page into b (empty on entry) */
typedef void (*kvb_http_render_pt)(void *data, kvb_buf_t *b);


/*
 * addr: "IPv4:PORT", "[IPv6]:PORT" or "localhost:PORT" (no name lookup:
 * it would block).  NULL with err when it cannot listen.
 */
kvb_http_t *kvb_http_create(const char *addr, kvb_http_render_pt render,
    void *data, char *err, size_t errlen);
void kvb_http_destroy(kvb_http_t *h);

/* the loop's source callbacks (kvb_loop.h); at most 1 + KVB_HTTP_CONNS */
int kvb_http_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max);
void kvb_http_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms);
uint64_t kvb_http_deadline(void *data);
void kvb_http_tick(void *data, uint64_t now_ms);


#endif /* _KVB_HTTP_H_INCLUDED_ */
