/*
 * kvbridge: the bridge's two Redis links, driven by its poll loop.
 *
 * One link publishes the module's event messages; the other subscribes to
 * the resync channel, where nginx asks for a server's snapshot.  Both are
 * hiredis' asynchronous client on non-blocking sockets: a slow or dead
 * Redis never stops the bridge from draining the engines' sockets (what
 * the engines publish while nobody reads is lost, silently, past ZeroMQ's
 * high-water mark).  A link that drops is reconnected with a backoff; what
 * was to be published meanwhile is dropped, and the seq it would have
 * taken makes nginx ask for a resync once Redis is back.
 *
 * A Redis that stops answering (stopped, swapping, a link that went
 * quiet) is told by the loop's clock: a link waiting longer than
 * timeout_ms for any reply is dropped and made again, and an idle one is
 * PINGed so that it is never waiting unseen.  What is sent and not yet
 * answered is bounded in bytes (max_pending_bytes, or one message when
 * that is bigger): past it a message is dropped, and counted, rather than
 * queued; the bytes hiredis held go back to the system once nothing
 * waits, or with the link dropped.
 *
 * On a Redis Cluster (conf.cluster), each link asks the node it reached
 * (CLUSTER SLOTS) which master owns the channel's slot, and moves there:
 * the publisher SPUBLISHes, the subscriber SSUBSCRIBEs to the resync
 * channel (the channel's hash tag puts it in the same slot).  MOVED, an
 * "sunsubscribe" or a lost node sends the link back to ask again; a node
 * that does not answer is replaced by the next one the cluster named.
 */

#ifndef _KVB_REDIS_H_INCLUDED_
#define _KVB_REDIS_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>

#include <zmq.h>


typedef struct {
    /* nginx asks for this server's snapshot (of one data-parallel rank) */
    void                  (*resync)(void *data, const char *server,
                                    size_t len, unsigned rank);
    void                   *data;
} kvb_redis_handler_t;


typedef struct {
    const char             *host;
    int                     port;
    const char             *user;       /* NULL: AUTH with password alone */
    const char             *password;   /* NULL: no AUTH */
    const char             *channel;    /* the events channel */
    size_t                  max_pending_bytes;  /* sent, not answered */
    unsigned                timeout_ms;         /* 0: 5000 */
    int                     cluster;    /* host:port a Redis Cluster seed */
    const char *const      *seed_hosts; /* cluster: more seeds after it */
    const int              *seed_ports;
    size_t                  nseeds;     /* in seed_hosts, host:port first */
} kvb_redis_conf_t;


typedef enum {
    KVB_REDIS_DOWN = 0,         /* waiting to connect again */
    KVB_REDIS_CONNECTING,       /* connected, not yet answered */
    KVB_REDIS_UP
} kvb_redis_state_e;


typedef struct {
    uint64_t                published;
    uint64_t                dropped;    /* Redis down or behind */
    uint64_t                dropped_bytes;
    uint64_t                lost;       /* sent, then the link dropped
                                           before Redis answered */
    uint64_t                publish_errors; /* Redis answered an error */
    uint64_t                timeouts;   /* links dropped for no reply */
    uint64_t                resyncs;    /* requests heard */
    uint64_t                bad_requests;
    uint64_t                reconnects;

    /* gauges: now */
    uint64_t                pending;        /* PUBLISHes not answered */
    uint64_t                pending_bytes;
    kvb_redis_state_e       publish_state;
    kvb_redis_state_e       subscribe_state;
} kvb_redis_stats_t;


typedef struct kvb_redis_s  kvb_redis_t;


kvb_redis_t *kvb_redis_create(const kvb_redis_conf_t *conf,
    const kvb_redis_handler_t *h);
void kvb_redis_destroy(kvb_redis_t *r);

/* 0: on its way; -1: dropped (the publishing link is down or behind) */
int kvb_redis_publish(kvb_redis_t *r, const char *msg, size_t len);

/* 1 when the publishing link is up */
int kvb_redis_up(const kvb_redis_t *r);

/* adds the links' sockets to items (at most 2), returns how many */
int kvb_redis_watch(kvb_redis_t *r, zmq_pollitem_t *items);
/* after zmq_poll(): the same items, with their revents */
void kvb_redis_io(kvb_redis_t *r, const zmq_pollitem_t *items, int n);

uint64_t kvb_redis_deadline(const kvb_redis_t *r);
void kvb_redis_tick(kvb_redis_t *r, uint64_t now_ms);

const kvb_redis_stats_t *kvb_redis_stats(const kvb_redis_t *r);
/* "down", "connecting", "up" */
const char *kvb_redis_state_name(kvb_redis_state_e state);


#endif /* _KVB_REDIS_H_INCLUDED_ */
