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


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_share_slice.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_budget.h"


/* how often the subscribing worker sends what queued up */
#define NGX_HTTP_KV_AWARE_SHARE_EVERY    50     /* ms */


/*
 * CHANNEL:learned in the subscribing worker, a part of its subscriber
 * (ngx_http_kv_aware_subscription.c): made at start, in the cycle's pool.
 */
typedef struct {
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_redis_t      *redis;
    uint64_t                        seq;          /* of what we send */
    uint64_t                       *hashes;       /* taken out of the ring */
    uint16_t                       *slots;        /* SHARE_RING each */
    ngx_http_kv_aware_budget_t      budget;
    ngx_msec_t                      logged;
} ngx_http_kv_aware_share_channel_t;


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
