/*
 * ngx_http_kv_aware_module: the subscription to KV events.
 *
 * One worker per nginx instance subscribes, for every upstream with
 * kv_aware_events: it starts the Redis link with the event path as its
 * handlers, and stops both in one place.  On a reload the old cycle's
 * subscriber hands the subscription over, so that no event is lost.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_redis.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"


#define NGX_HTTP_KV_AWARE_HANDOVER_TICK 50


static ngx_int_t ngx_http_kv_aware_events_each(ngx_cycle_t *cycle,
    ngx_int_t (*handler)(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf));
static ngx_int_t ngx_http_kv_aware_events_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);
static ngx_int_t ngx_http_kv_aware_events_stop(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);
static void ngx_http_kv_aware_events_closing(void *data);
static ngx_int_t ngx_http_kv_aware_handover(
    ngx_http_kv_aware_srv_conf_t *kcf);
static void ngx_http_kv_aware_handover_handler(ngx_event_t *ev);


/* one subscriber per nginx instance: the first worker holds it */
ngx_int_t
ngx_http_kv_aware_events_init_process(ngx_cycle_t *cycle)
{
    if ((ngx_process != NGX_PROCESS_WORKER
         && ngx_process != NGX_PROCESS_SINGLE)
        || ngx_worker != 0)
    {
        return NGX_OK;
    }

    return ngx_http_kv_aware_events_each(cycle,
                                         ngx_http_kv_aware_events_start);
}


void
ngx_http_kv_aware_events_exit_process(ngx_cycle_t *cycle)
{
    (void) ngx_http_kv_aware_events_each(cycle,
                                         ngx_http_kv_aware_events_stop);
}


static ngx_int_t
ngx_http_kv_aware_events_each(ngx_cycle_t *cycle,
    ngx_int_t (*handler)(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf))
{
    ngx_uint_t                      i;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_upstream_module);
    if (umcf == NULL) {
        return NGX_OK;
    }

    uscfp = umcf->upstreams.elts;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->events && kcf->sh && handler(cycle, kcf) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_events_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_http_kv_aware_events_conf_t     *ecf;
    ngx_http_kv_aware_redis_handlers_t   handlers;

    ecf = kcf->events;

    ecf->tick.handler = ngx_http_kv_aware_events_tick;
    ecf->tick.data = kcf;
    ecf->tick.log = cycle->log;
    ecf->tick.cancelable = 1;

    /* not cancelable: it keeps an exiting worker until the handover */
    ecf->handover.handler = ngx_http_kv_aware_handover_handler;
    ecf->handover.data = kcf;
    ecf->handover.log = cycle->log;

    ngx_add_timer(&ecf->tick, NGX_HTTP_KV_AWARE_TICK);

    if (ecf->share) {
        ecf->share_hashes = ngx_palloc(cycle->pool,
                                       NGX_HTTP_KV_AWARE_SHARE_RING
                                       * sizeof(uint64_t));
        ecf->share_slots = ngx_palloc(cycle->pool,
                                      NGX_HTTP_KV_AWARE_SHARE_RING);

        if (ecf->share_hashes == NULL || ecf->share_slots == NULL) {
            return NGX_ERROR;
        }

        ecf->share_tick.handler = ngx_http_kv_aware_share_tick;
        ecf->share_tick.data = kcf;
        ecf->share_tick.log = cycle->log;
        ecf->share_tick.cancelable = 1;

        ngx_add_timer(&ecf->share_tick, NGX_HTTP_KV_AWARE_SHARE_EVERY);
    }

    handlers.message = ngx_http_kv_aware_events_message;
    handlers.second = ngx_http_kv_aware_share_message;
    handlers.subscribed = ngx_http_kv_aware_events_subscribed;
    handlers.lost = ngx_http_kv_aware_events_lost;
    handlers.closing = ngx_http_kv_aware_events_closing;
    handlers.data = kcf;

    ecf->redis = ngx_http_kv_aware_redis_start(cycle, &ecf->link,
                                               &kcf->sh->redis, &handlers);
    if (ecf->redis == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* in the exiting worker, or once the handover is done: idempotent */
static ngx_int_t
ngx_http_kv_aware_events_stop(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_http_kv_aware_redis_t        *rd;
    ngx_http_kv_aware_events_conf_t  *ecf;

    ecf = kcf->events;
    rd = ecf->redis;

    /* held for a takeover that will not come */

    while (ecf->nheld) {
        ngx_free(ecf->held[--ecf->nheld].msg);
    }

    ecf->held_bytes = 0;

    if (rd == NULL) {
        return NGX_OK;
    }

    ecf->redis = NULL;

    ngx_http_kv_aware_redis_stop(rd);

    if (ecf->tick.timer_set) {
        ngx_del_timer(&ecf->tick);
    }

    if (ecf->share_tick.timer_set) {
        ngx_del_timer(&ecf->share_tick);
    }

    if (ecf->handover.timer_set) {
        ngx_del_timer(&ecf->handover);
    }

    (void) ngx_atomic_cmp_set(&kcf->sh->events.sub_live, kcf->generation, 0);

    return NGX_OK;
}


/* graceful shutdown asks the link to go */
static void
ngx_http_kv_aware_events_closing(void *data)
{
    ngx_http_kv_aware_srv_conf_t *kcf = data;

    if (ngx_http_kv_aware_handover(kcf) != NGX_OK) {
        /* leave the channel to the new workers now */
        (void) ngx_http_kv_aware_events_stop(NULL, kcf);
    }
}


/*
 * The worker is exiting (a reload or a quit).  On a reload, the old
 * subscription stays until the new cycle's subscriber is in, so that no
 * event published meanwhile is lost; NGX_DECLINED: let go now.
 */
static ngx_int_t
ngx_http_kv_aware_handover(ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_http_kv_aware_events_conf_t  *ecf;

    ecf = kcf->events;

    if (ecf->handover.timer_set) {
        return NGX_OK;
    }

    if (ecf->handover_start
        || kcf->sh->generation == kcf->generation    /* a quit */
        || kcf->sh->events.sub_live != kcf->generation)
    {
        return NGX_DECLINED;
    }

    ecf->handover_start = ngx_current_msec;
    ngx_add_timer(&ecf->handover, NGX_HTTP_KV_AWARE_HANDOVER_TICK);

    return NGX_OK;
}


static void
ngx_http_kv_aware_handover_handler(ngx_event_t *ev)
{
    ngx_http_kv_aware_srv_conf_t *kcf = ev->data;

    ngx_http_kv_aware_events_conf_t  *ecf;

    ecf = kcf->events;

    /*
     * Once the new subscriber is in, one more tick lets what Redis sent
     * us before it subscribed come in; then the old one lets go.
     */
    if (kcf->sh->events.sub_live == kcf->generation
        && ngx_current_msec - ecf->handover_start
           < ecf->link.connect_timeout + NGX_HTTP_KV_AWARE_HANDOVER)
    {
        if (kcf->sh->events.sub_gen <= kcf->generation || !ecf->handover_last) {
            ecf->handover_last = (kcf->sh->events.sub_gen > kcf->generation);
            ngx_add_timer(ev, NGX_HTTP_KV_AWARE_HANDOVER_TICK);
            return;
        }
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                   "kv_aware: upstream \"%V\" lets the subscription go",
                   &kcf->upstream);

    (void) ngx_http_kv_aware_events_stop(NULL, kcf);
}
