/*
 * kvbridge: the collector's trust boundary.  Whoever reaches --collect
 * can publish as any engine its topic names, so:
 *
 *   - an allow list of peer addresses (--collect-allow), enforced by
 *     ZeroMQ's ZAP: the bridge serves the context's ZAP handler (an
 *     inproc REP socket, a source of the loop) and answers 200 for an
 *     allowed IP, 400 otherwise; a refused peer's connection is closed
 *     during the handshake, before any message of it is read;
 *   - a rate a peer (--collect-rate, messages a second, a burst of one
 *     second's worth): past it, its messages are dropped and counted;
 *     ZeroMQ tells a message's peer by its "Peer-Address" property.
 */

#ifndef _KVB_GUARD_H_INCLUDED_
#define _KVB_GUARD_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "kvb_loop.h"


/* the ZAP domain the collector's socket names */
#define KVB_GUARD_DOMAIN     "kvbridge-collect"
#define KVB_GUARD_ALLOW_MAX  64
/* peers whose rate is tracked; past it the longest quiet is forgotten */
#define KVB_GUARD_PEERS      256


typedef struct {
    uint64_t                allowed;    /* connections */
    uint64_t                denied;
    uint64_t                limited;    /* messages over a peer's rate */
} kvb_guard_stats_t;


typedef struct kvb_guard_s  kvb_guard_t;


/*
 * allow: "IP[,IP...]" or NULL (anyone); rate: messages a second a peer,
 * 0 for no cap.  With an allow list, binds the context's ZAP handler:
 * call before the collector binds.  NULL with err on a bad list.
 */
kvb_guard_t *kvb_guard_create(void *zctx, const char *allow, size_t rate,
    char *err, size_t errlen);
void kvb_guard_destroy(kvb_guard_t *g);

/* sets the collector's ZAP domain when there is an allow list */
int kvb_guard_socket(kvb_guard_t *g, void *collect);

/* 1: the message (its first part) may go on; 0: over its peer's rate */
int kvb_guard_rate(kvb_guard_t *g, zmq_msg_t *msg, uint64_t now_ms);

/* the ZAP handler as a source of the loop (none without an allow list) */
int kvb_guard_watch(void *data, uint64_t now_ms, zmq_pollitem_t *items,
    int max);
void kvb_guard_io(void *data, const zmq_pollitem_t *items, int n,
    kvb_budget_t *b, uint64_t now_ms);

const kvb_guard_stats_t *kvb_guard_stats(const kvb_guard_t *g);


#endif /* _KVB_GUARD_H_INCLUDED_ */
