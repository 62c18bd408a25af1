/*
 * kvbridge's scrape tests: a loopback HTTP server in a child process and
 * the bridge's loop for one scrape (kvb_test_server.c).
 *
 * Paths: /metrics (checks the request a proxy would see), /length,
 * /chunked, /sglang, /close, /slow, /slowbody, /500, /biglength,
 * /bigclose, /bigchunked, /trunc, /badchunk, /gzip, /garbage, /empty,
 * /nometrics, /headers.
 */

#ifndef _KVB_TEST_SERVER_H_INCLUDED_
#define _KVB_TEST_SERVER_H_INCLUDED_


#include <stdint.h>

#include "kvb_scrape.h"


extern unsigned short  srv_port;

uint64_t now_ms(void);

/* 0 once the child listens on srv_port; srv_stop() kills it */
int srv_start(void);
void srv_stop(void);

/* the bridge's loop, for one scrape: 0 when it ended, -1 past max_ms */
int drive(kvb_scrape_t *s, unsigned max_ms);

/* a scrape of path on the server, driven to its end; NULL on a bad URL */
kvb_scrape_t *scrape(const char *path, unsigned timeout_ms,
    kvb_scrape_stats_t *st, uint64_t *took);

/* the one scrape so far failed, its error saying why */
int failed_with(const kvb_scrape_stats_t *st, const char *why);


#endif /* _KVB_TEST_SERVER_H_INCLUDED_ */
