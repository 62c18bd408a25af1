/*
 * ngx_http_kv_aware_module: KV events from Redis into the shared index,
 * the kv_aware_events directive and the subscribing worker's lifecycle.
 */

#ifndef _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_redis.h"
#include "kva_event.h"


#define NGX_HTTP_KV_AWARE_TICK          500    /* ms, sync state checks */

/*
 * A reload hands the subscription over: the old cycle's subscriber stays
 * until the new one has subscribed (at most connect_timeout plus this),
 * and for this long both may see a message the other applied.
 */
#define NGX_HTTP_KV_AWARE_HANDOVER      1000

/* what a new subscriber keeps while the old one still applies */
#define NGX_HTTP_KV_AWARE_HELD_MAX      256
#define NGX_HTTP_KV_AWARE_HELD_BYTES    (8 * 1024 * 1024)


typedef struct {
    u_char                         *msg;          /* ngx_alloc()ed */
    size_t                          len;
} ngx_http_kv_aware_held_t;


/* kv_aware_events: where the upstream's KV events come from */
struct ngx_http_kv_aware_events_conf_s {
    ngx_http_kv_aware_redis_conf_t  link;
    ngx_str_t                       resync_channel;
    ngx_msec_t                      heartbeat;
    ngx_msec_t                      spec_ttl;
    size_t                          max_message;
    ngx_uint_t                      max_hashes;
    ngx_uint_t                      max_events;
    ngx_uint_t                      max_rate;     /* messages per second */
    size_t                          server_bytes; /* a second, per server */
    ngx_uint_t                      server_hashes;
    ngx_flag_t                      share;        /* CHANNEL:learned */

    /* the subscribing worker's own state */
    ngx_http_kv_aware_redis_t      *redis;
    ngx_event_t                     tick;
    ngx_event_t                     handover;     /* old cycle, exiting */
    ngx_msec_t                      handover_start;
    ngx_uint_t                      handover_last; /* the tick after */
    ngx_msec_t                      took_over;    /* from a live older */

    /*
     * What this (new) subscriber heard while the old one still applied:
     * applied in order once it lets go, those it applied skipped by seq,
     * so that a message the old one never read before it let go is not
     * lost.
     */
    ngx_http_kv_aware_held_t        held[NGX_HTTP_KV_AWARE_HELD_MAX];
    ngx_uint_t                      nheld;
    size_t                          held_bytes;
    ngx_msec_t                      rate_start;
    ngx_uint_t                      rate_count;
    ngx_uint_t                      scanned;      /* entries, this window */
    size_t                          srv_bytes[KVA_MAX_SLOTS];
    ngx_uint_t                      srv_hashes[KVA_MAX_SLOTS];
    ngx_msec_t                      logged[NGX_HTTP_KV_AWARE_REJ_LAST];

    /* share=on: the sending timer, and what it takes out of the ring */
    ngx_event_t                     share_tick;
    uint64_t                        share_seq;
    uint64_t                       *share_hashes;
    u_char                         *share_slots;
    ngx_msec_t                      share_logged;

    /*
     * The learned channel's budgets: max_rate, server_bytes and
     * server_hashes as the events channel's, counted apart so that a
     * flood on either channel costs the other nothing.
     */
    ngx_msec_t                      share_rate_start;
    ngx_uint_t                      share_rate_count;
    size_t                          share_srv_bytes[KVA_MAX_SLOTS];
    ngx_uint_t                      share_srv_hashes[KVA_MAX_SLOTS];
};


/* ngx_http_kv_aware_events_conf.c */
char *ngx_http_kv_aware_events_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_http_kv_aware_subscription.c: one subscriber, in the first worker */
ngx_int_t ngx_http_kv_aware_events_init_process(ngx_cycle_t *cycle);
void ngx_http_kv_aware_events_exit_process(ngx_cycle_t *cycle);

/*
 * ngx_http_kv_aware_events.c: the event path, the Redis link's handlers
 * (data is the upstream's ngx_http_kv_aware_srv_conf_t) and the tick.
 */
void ngx_http_kv_aware_events_message(void *data, u_char *msg, size_t len);
void ngx_http_kv_aware_events_subscribed(void *data);
void ngx_http_kv_aware_events_lost(void *data);
void ngx_http_kv_aware_events_tick(ngx_event_t *ev);

/* the reject class of a decoder's refusal (kva_event_rc_e) */
ngx_http_kv_aware_reject_e ngx_http_kv_aware_reject_class(
    kva_event_rc_e rc);


#endif /* _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_ */
