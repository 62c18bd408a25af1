/*
 * ngx_http_kv_aware_module: what this nginx routed, shared with the other
 * nginx in front of the same servers (kv_aware_events share=on).
 *
 * Without events from the servers each nginx learns only from its own
 * routing, so a conversation whose turns reach different instances loses
 * its affinity.  With sharing, every worker queues the blocks it routes
 * to a server that publishes nothing in a ring in the zone; the
 * subscribing worker sends them, batched, on CHANNEL:learned, and applies
 * what the other instances sent there as learned entries.
 */

#ifndef _NGX_HTTP_KV_AWARE_SHARE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_SHARE_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_budget.h"


/* hashes waiting to go out: a power of two */
#define NGX_HTTP_KV_AWARE_SHARE_RING     8192

/* how often the subscribing worker sends what queued up */
#define NGX_HTTP_KV_AWARE_SHARE_EVERY    50     /* ms */


/* the share ring's counters, as the status pages show them */
typedef struct {
    ngx_atomic_t                    sent;         /* hashes */
    ngx_atomic_t                    received;     /* hashes applied */
    ngx_atomic_t                    dropped;      /* ring full, or Redis */
    ngx_atomic_t                    refused;      /* messages */
    ngx_atomic_t                    messages_out;
    ngx_atomic_t                    messages_in;
} ngx_http_kv_aware_share_stats_t;


/* the share ring's slice of the zone, written under its lock */
typedef struct {
    uint64_t                        origin;       /* this instance's */
    ngx_uint_t                      head;         /* next to send */
    ngx_uint_t                      tail;         /* next free */
    ngx_http_kv_aware_share_stats_t  stats;
    uint64_t                        hashes[NGX_HTTP_KV_AWARE_SHARE_RING];
    u_char                          slots[NGX_HTTP_KV_AWARE_SHARE_RING];
} ngx_http_kv_aware_share_t;

/*
 * CHANNEL:learned in the subscribing worker, a part of its subscriber
 * (ngx_http_kv_aware_subscription.c): made at start, in the cycle's pool.
 */
typedef struct {
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_redis_t      *redis;
    uint64_t                        seq;          /* of what we send */
    uint64_t                       *hashes;       /* taken out of the ring */
    u_char                         *slots;        /* SHARE_RING each */
    ngx_http_kv_aware_budget_t      budget;
    ngx_msec_t                      logged;
} ngx_http_kv_aware_share_channel_t;


/* what the zone grows by for it (kv_aware adds it to index_size) */
#define ngx_http_kv_aware_share_size()                                        \
    ngx_align(sizeof(ngx_http_kv_aware_share_t), ngx_pagesize)


/* queues a request's newly learned blocks; the zone's lock is held */
void ngx_http_kv_aware_share_queue(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, const uint64_t *hashes, ngx_uint_t n);

/*
 * The subscribing worker: the channel made at its start, its timer (the
 * data is the channel), and the messages on CHANNEL:learned.
 */
ngx_int_t ngx_http_kv_aware_share_init(ngx_http_kv_aware_share_channel_t *sc,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_pool_t *pool);
void ngx_http_kv_aware_share_tick(ngx_event_t *ev);
void ngx_http_kv_aware_share_message(ngx_http_kv_aware_share_channel_t *sc,
    u_char *msg, size_t len);


#endif /* _NGX_HTTP_KV_AWARE_SHARE_H_INCLUDED_ */
