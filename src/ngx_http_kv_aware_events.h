/*
 * ngx_http_kv_aware_module: KV events from Redis into the shared index,
 * the kv_aware_events directive and the subscribing worker's lifecycle.
 */

#ifndef _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_events_slice.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_budget.h"
#include "kva_event.h"
#include "kva_index.h"


#define NGX_HTTP_KV_AWARE_TICK          500    /* ms, sync state checks */

/*
 * A reload hands the subscription over: the old cycle's subscriber stays
 * until the new one has subscribed (at most connect_timeout plus this),
 * and for this long both may see a message the other applied.
 */
#define NGX_HTTP_KV_AWARE_HANDOVER      1000


/* kv_aware_events: where the upstream's KV events come from */
struct ngx_http_kv_aware_events_conf_s {
    ngx_http_kv_aware_redis_conf_t  link;
    ngx_str_t                       resync_channel;
    ngx_msec_t                      heartbeat;
    ngx_msec_t                      spec_ttl;
    size_t                          max_message;
    ngx_uint_t                      max_hashes;
    ngx_uint_t                      max_events;
    ngx_http_kv_aware_budget_conf_t  budget;      /* either channel's */
    ngx_flag_t                      share;        /* CHANNEL:learned */
};


/*
 * The event path in the subscribing worker, a part of its subscriber
 * (ngx_http_kv_aware_subscription.c): made at start, in the cycle's pool.
 */
typedef struct {
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_kv_aware_redis_t      *redis;        /* resync requests */
    ngx_msec_t                      took_over;    /* from a live older */
    ngx_http_kv_aware_budget_t      budget;
    ngx_msec_t                      logged[NGX_HTTP_KV_AWARE_REJ_LAST];
} ngx_http_kv_aware_event_path_t;


/* ngx_http_kv_aware_events_conf.c */
char *ngx_http_kv_aware_events_conf_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);

/* ngx_http_kv_aware_subscription.c: one subscriber, in the first worker */
ngx_int_t ngx_http_kv_aware_subscription_init_process(ngx_cycle_t *cycle);
void ngx_http_kv_aware_subscription_exit_process(ngx_cycle_t *cycle);

/*
 * ngx_http_kv_aware_events.c: the event path, called by the subscription
 * for what the Redis link reports; the tick's data is the event path.
 */
void ngx_http_kv_aware_events_message(ngx_http_kv_aware_event_path_t *ep,
    u_char *msg, size_t len);
void ngx_http_kv_aware_events_subscribed(ngx_http_kv_aware_event_path_t *ep);
void ngx_http_kv_aware_events_lost(ngx_http_kv_aware_event_path_t *ep);
void ngx_http_kv_aware_events_tick(ngx_event_t *ev);

/* the reject class of a decoder's refusal (kva_event_rc_e) */
ngx_http_kv_aware_reject_e ngx_http_kv_aware_events_reject_class(
    kva_event_rc_e rc);


#endif /* _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_ */
