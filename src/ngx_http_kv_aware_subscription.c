/*
 * ngx_http_kv_aware_module: the subscription to KV events.
 *
 * One worker per nginx instance subscribes, for every upstream with
 * kv_aware_events: it makes a subscriber, which starts the Redis link
 * and hands what the link reports to the event path and the share
 * channel, and stops them all in one place.  On a reload the old cycle's
 * subscriber hands the subscription over, so that no event is lost: the
 * subscriber decides whether it or the old one applies a message.
 *
 * The subscriber is the worker's state, made at start in the cycle's
 * pool; the configuration is only read.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"


#define NGX_HTTP_KV_AWARE_HANDOVER_TICK 50

/* what a new subscriber keeps while the old one still applies */
#define NGX_HTTP_KV_AWARE_HELD_MAX      256
#define NGX_HTTP_KV_AWARE_HELD_BYTES    (8 * 1024 * 1024)

/* what ngx_http_kv_aware_applier() says of a message */
#define NGX_HTTP_KV_AWARE_SKIP          0   /* the other subscriber's */
#define NGX_HTTP_KV_AWARE_APPLY         1
#define NGX_HTTP_KV_AWARE_HOLD          2   /* the old one may apply it */


typedef struct {
    u_char                             *msg;      /* ngx_alloc()ed */
    size_t                              len;
} ngx_http_kv_aware_held_t;


typedef struct ngx_http_kv_aware_subscriber_s  ngx_http_kv_aware_subscriber_t;

/* one upstream's subscription, in the subscribing worker */
struct ngx_http_kv_aware_subscriber_s {
    ngx_http_kv_aware_srv_conf_t       *kcf;
    ngx_http_kv_aware_redis_t          *redis;
    ngx_http_kv_aware_event_path_t      events;
    ngx_http_kv_aware_share_channel_t   share;    /* share=on */

    ngx_event_t                         tick;
    ngx_event_t                         share_tick;
    ngx_event_t                         handover; /* old cycle, exiting */
    ngx_msec_t                          handover_start;
    ngx_uint_t                          handover_last; /* the tick after */

    /*
     * What this (new) subscriber heard while the old one still applied:
     * applied in order once it lets go, those it applied skipped by seq,
     * so that a message the old one never read before it let go is not
     * lost.
     */
    ngx_http_kv_aware_held_t            held[NGX_HTTP_KV_AWARE_HELD_MAX];
    ngx_uint_t                          nheld;
    size_t                              held_bytes;

    ngx_http_kv_aware_subscriber_t     *next;     /* this worker's others */
};


static ngx_int_t ngx_http_kv_aware_subscriber_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);
static void ngx_http_kv_aware_subscriber_stop(
    ngx_http_kv_aware_subscriber_t *sub);
static void ngx_http_kv_aware_subscribers_forget(void *data);
static void ngx_http_kv_aware_subscriber_message(void *data, u_char *msg,
    size_t len);
static void ngx_http_kv_aware_subscriber_learned(void *data, u_char *msg,
    size_t len);
static void ngx_http_kv_aware_subscriber_subscribed(void *data);
static void ngx_http_kv_aware_subscriber_lost(void *data);
static void ngx_http_kv_aware_subscriber_closing(void *data);
static ngx_uint_t ngx_http_kv_aware_applier(
    ngx_http_kv_aware_subscriber_t *sub);
static void ngx_http_kv_aware_hold(ngx_http_kv_aware_subscriber_t *sub,
    u_char *msg, size_t len);
static ngx_int_t ngx_http_kv_aware_handover(
    ngx_http_kv_aware_subscriber_t *sub);
static void ngx_http_kv_aware_handover_handler(ngx_event_t *ev);


/* this worker's subscribers, in its cycle's pool */
static ngx_http_kv_aware_subscriber_t  *ngx_http_kv_aware_subscribers;


/* one subscriber per nginx instance: the first worker holds it */
ngx_int_t
ngx_http_kv_aware_subscription_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                      i;
    ngx_pool_cleanup_t             *cln;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    if ((ngx_process != NGX_PROCESS_WORKER
         && ngx_process != NGX_PROCESS_SINGLE)
        || ngx_worker != 0)
    {
        return NGX_OK;
    }

    umcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_upstream_module);
    if (umcf == NULL) {
        return NGX_OK;
    }

    /* the list goes with the pool its subscribers are in */
    cln = ngx_pool_cleanup_add(cycle->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_kv_aware_subscribers_forget;

    uscfp = umcf->upstreams.elts;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->events && kcf->sh
            && ngx_http_kv_aware_subscriber_start(cycle, kcf) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


void
ngx_http_kv_aware_subscription_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_kv_aware_subscriber_t  *sub;

    for (sub = ngx_http_kv_aware_subscribers; sub; sub = sub->next) {
        ngx_http_kv_aware_subscriber_stop(sub);
    }
}


static void
ngx_http_kv_aware_subscribers_forget(void *data)
{
    ngx_http_kv_aware_subscribers = NULL;
}


static ngx_int_t
ngx_http_kv_aware_subscriber_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_http_kv_aware_subscriber_t      *sub;
    ngx_http_kv_aware_events_conf_t     *ecf;
    ngx_http_kv_aware_redis_handlers_t   handlers;

    ecf = kcf->events;

    sub = ngx_pcalloc(cycle->pool, sizeof(ngx_http_kv_aware_subscriber_t));
    if (sub == NULL) {
        return NGX_ERROR;
    }

    sub->kcf = kcf;
    sub->events.kcf = kcf;

    sub->next = ngx_http_kv_aware_subscribers;
    ngx_http_kv_aware_subscribers = sub;

    sub->tick.handler = ngx_http_kv_aware_events_tick;
    sub->tick.data = &sub->events;
    sub->tick.log = cycle->log;
    sub->tick.cancelable = 1;

    /* not cancelable: it keeps an exiting worker until the handover */
    sub->handover.handler = ngx_http_kv_aware_handover_handler;
    sub->handover.data = sub;
    sub->handover.log = cycle->log;

    ngx_add_timer(&sub->tick, NGX_HTTP_KV_AWARE_TICK);

    if (ecf->share) {
        if (ngx_http_kv_aware_share_init(&sub->share, kcf, cycle->pool)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        sub->share_tick.handler = ngx_http_kv_aware_share_tick;
        sub->share_tick.data = &sub->share;
        sub->share_tick.log = cycle->log;
        sub->share_tick.cancelable = 1;

        ngx_add_timer(&sub->share_tick, NGX_HTTP_KV_AWARE_SHARE_EVERY);
    }

    handlers.message = ngx_http_kv_aware_subscriber_message;
    handlers.second = ngx_http_kv_aware_subscriber_learned;
    handlers.subscribed = ngx_http_kv_aware_subscriber_subscribed;
    handlers.lost = ngx_http_kv_aware_subscriber_lost;
    handlers.closing = ngx_http_kv_aware_subscriber_closing;
    handlers.data = sub;

    sub->redis = ngx_http_kv_aware_redis_start(cycle, &ecf->link,
                                               &kcf->sh->redis, &handlers);
    if (sub->redis == NULL) {
        return NGX_ERROR;
    }

    sub->events.redis = sub->redis;
    sub->share.redis = sub->redis;

    return NGX_OK;
}


/* in the exiting worker, or once the handover is done: idempotent */
static void
ngx_http_kv_aware_subscriber_stop(ngx_http_kv_aware_subscriber_t *sub)
{
    ngx_http_kv_aware_redis_t  *rd;

    rd = sub->redis;

    /* held for a takeover that will not come */

    while (sub->nheld) {
        ngx_free(sub->held[--sub->nheld].msg);
    }

    sub->held_bytes = 0;

    if (rd == NULL) {
        return;
    }

    sub->redis = NULL;
    sub->events.redis = NULL;
    sub->share.redis = NULL;

    ngx_http_kv_aware_redis_stop(rd);

    if (sub->tick.timer_set) {
        ngx_del_timer(&sub->tick);
    }

    if (sub->share_tick.timer_set) {
        ngx_del_timer(&sub->share_tick);
    }

    if (sub->handover.timer_set) {
        ngx_del_timer(&sub->handover);
    }

    (void) ngx_atomic_cmp_set(&sub->kcf->sh->events.sub_live,
                              sub->kcf->generation, 0);
}


static void
ngx_http_kv_aware_subscriber_message(void *data, u_char *msg, size_t len)
{
    ngx_http_kv_aware_subscriber_t *sub = data;

    ngx_uint_t  i, n;

    switch (ngx_http_kv_aware_applier(sub)) {

    case NGX_HTTP_KV_AWARE_HOLD:
        ngx_http_kv_aware_hold(sub, msg, len);
        return;

    case NGX_HTTP_KV_AWARE_SKIP:
        return;

    default:
        break;
    }

    /* taken over: first what came while the old subscriber applied */

    n = sub->nheld;
    sub->nheld = 0;
    sub->held_bytes = 0;

    for (i = 0; i < n; i++) {
        ngx_http_kv_aware_events_message(&sub->events, sub->held[i].msg,
                                         sub->held[i].len);
        ngx_free(sub->held[i].msg);
    }

    ngx_http_kv_aware_events_message(&sub->events, msg, len);
}


/* CHANNEL:learned: hints, applied by whoever hears them */
static void
ngx_http_kv_aware_subscriber_learned(void *data, u_char *msg, size_t len)
{
    ngx_http_kv_aware_subscriber_t *sub = data;

    ngx_http_kv_aware_share_message(&sub->share, msg, len);
}


static void
ngx_http_kv_aware_subscriber_subscribed(void *data)
{
    ngx_http_kv_aware_subscriber_t *sub = data;

    ngx_http_kv_aware_events_subscribed(&sub->events);
}


static void
ngx_http_kv_aware_subscriber_lost(void *data)
{
    ngx_http_kv_aware_subscriber_t *sub = data;

    ngx_http_kv_aware_events_lost(&sub->events);
}


/* graceful shutdown asks the link to go */
static void
ngx_http_kv_aware_subscriber_closing(void *data)
{
    ngx_http_kv_aware_subscriber_t *sub = data;

    if (ngx_http_kv_aware_handover(sub) != NGX_OK) {
        /* leave the channel to the new workers now */
        ngx_http_kv_aware_subscriber_stop(sub);
    }
}


/*
 * Whether this subscriber applies what it gets.  On a reload the old
 * cycle's subscriber goes on applying until it lets go (or dies: the
 * new one waits a bounded time), so that each message is applied once
 * and in order; the new one then takes over.
 */
static ngx_uint_t
ngx_http_kv_aware_applier(ngx_http_kv_aware_subscriber_t *sub)
{
    ngx_msec_t                     took_over;
    ngx_uint_t                     live;
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = sub->kcf;
    live = kcf->sh->events.sub_live;
    took_over = sub->events.took_over;

    if (live == kcf->generation) {
        return NGX_HTTP_KV_AWARE_APPLY;
    }

    if (kcf->generation < kcf->sh->events.sub_gen) {
        /* an old subscriber past its handover */
        return NGX_HTTP_KV_AWARE_SKIP;
    }

    if (live && live < kcf->generation && took_over
        && ngx_current_msec - took_over
           < kcf->events->link.connect_timeout + NGX_HTTP_KV_AWARE_HANDOVER)
    {
        /* the old one still applies, unless it lets go before reading */
        return NGX_HTTP_KV_AWARE_HOLD;
    }

    (void) ngx_atomic_cmp_set(&kcf->sh->events.sub_live, live, kcf->generation);

    return (kcf->sh->events.sub_live == kcf->generation)
           ? NGX_HTTP_KV_AWARE_APPLY : NGX_HTTP_KV_AWARE_SKIP;
}


static void
ngx_http_kv_aware_hold(ngx_http_kv_aware_subscriber_t *sub, u_char *msg,
    size_t len)
{
    u_char  *copy;

    /* past the bound, what is lost shows as a gap: a resync mends it */

    if (sub->nheld == NGX_HTTP_KV_AWARE_HELD_MAX
        || sub->held_bytes + len > NGX_HTTP_KV_AWARE_HELD_BYTES)
    {
        return;
    }

    copy = ngx_alloc(len ? len : 1, ngx_cycle->log);
    if (copy == NULL) {
        return;
    }

    ngx_memcpy(copy, msg, len);
    sub->held[sub->nheld].msg = copy;
    sub->held[sub->nheld].len = len;
    sub->nheld++;
    sub->held_bytes += len;
}


/*
 * The worker is exiting (a reload or a quit).  On a reload, the old
 * subscription stays until the new cycle's subscriber is in, so that no
 * event published meanwhile is lost; NGX_DECLINED: let go now.
 */
static ngx_int_t
ngx_http_kv_aware_handover(ngx_http_kv_aware_subscriber_t *sub)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = sub->kcf;

    if (sub->handover.timer_set) {
        return NGX_OK;
    }

    if (sub->handover_start
        || kcf->sh->generation == kcf->generation    /* a quit */
        || kcf->sh->events.sub_live != kcf->generation)
    {
        return NGX_DECLINED;
    }

    sub->handover_start = ngx_current_msec;
    ngx_add_timer(&sub->handover, NGX_HTTP_KV_AWARE_HANDOVER_TICK);

    return NGX_OK;
}


static void
ngx_http_kv_aware_handover_handler(ngx_event_t *ev)
{
    ngx_http_kv_aware_subscriber_t *sub = ev->data;

    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = sub->kcf;

    /*
     * Once the new subscriber is in, one more tick lets what Redis sent
     * us before it subscribed come in; then the old one lets go.
     */
    if (kcf->sh->events.sub_live == kcf->generation
        && ngx_current_msec - sub->handover_start
           < kcf->events->link.connect_timeout + NGX_HTTP_KV_AWARE_HANDOVER)
    {
        if (kcf->sh->events.sub_gen <= kcf->generation || !sub->handover_last) {
            sub->handover_last = (kcf->sh->events.sub_gen > kcf->generation);
            ngx_add_timer(ev, NGX_HTTP_KV_AWARE_HANDOVER_TICK);
            return;
        }
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                   "kv_aware: upstream \"%V\" lets the subscription go",
                   &kcf->upstream);

    ngx_http_kv_aware_subscriber_stop(sub);
}
