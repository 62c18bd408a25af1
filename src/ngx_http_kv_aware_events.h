/*
 * ngx_http_kv_aware_module: KV events from Redis into the shared index,
 * the kv_aware_events directive and the subscribing worker's lifecycle.
 */

#ifndef _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"
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

/*
 * What the module knows of a server's cache, from its events: never heard
 * from (learned only), events in sequence (precise), a snapshot arriving,
 * events lost (resync asked), silent past the heartbeat.
 */
#define NGX_HTTP_KV_AWARE_EV_STATES(X)                                        \
    X(EV_NONE, "learned")                                                     \
    X(EV_FRESH, "fresh")                                                      \
    X(EV_SYNCING, "syncing")                                                  \
    X(EV_DEGRADED, "degraded")                                                \
    X(EV_STALE, "stale")

typedef enum {
    NGX_HTTP_KV_AWARE_EV_STATES(NGX_HTTP_KV_AWARE_ENUM2)
    NGX_HTTP_KV_AWARE_EV_LAST
} ngx_http_kv_aware_ev_state_e;


/* classes of rejected event messages: status key, and what logs say */
#define NGX_HTTP_KV_AWARE_REJECTS(X)                                          \
    X(REJ_MALFORMED, "malformed", "malformed")                                \
    X(REJ_BAD_FIELD, "bad_field", "bad field")                                \
    X(REJ_VERSION, "version", "unsupported version")                          \
    X(REJ_TOO_BIG, "too_big", "over a size limit")                            \
    X(REJ_UNKNOWN_SERVER, "unknown_server", "unknown server")                 \
    X(REJ_FLOOD, "flood", "flood")                                            \
    X(REJ_KEYSPACE, "keyspace", "another key space than the upstream's keys")

typedef enum {
    NGX_HTTP_KV_AWARE_REJECTS(NGX_HTTP_KV_AWARE_ENUM3)
    NGX_HTTP_KV_AWARE_REJ_LAST
} ngx_http_kv_aware_reject_e;


/* the event path's slice of the zone (ngx_http_kv_aware_zone.h) */

/* a server's, in its slot: written by the subscribing worker, read by all */
typedef struct {
    ngx_uint_t                      state;
    ngx_uint_t                      has_seq;
    ngx_uint_t                      synced;       /* nothing missed since */
    uint64_t                        seq;
    ngx_msec_t                      heard;        /* ngx_current_msec */
    ngx_msec_t                      resync;       /* last resync asked */
    ngx_atomic_t                    messages;
    ngx_atomic_t                    hashes;
    ngx_atomic_t                    gaps;
    ngx_uint_t                      seq_gen;      /* subscriber of seq */
    ngx_uint_t                      has_load;
    uint32_t                        waiting;
    uint32_t                        running;
    uint32_t                        kv_usage;     /* per mille */
    uint64_t                        kv_tokens;    /* its pool, 0: unsaid */
} ngx_http_kv_aware_events_slot_t;


/* the upstream's */
typedef struct {
    ngx_atomic_t                    sub_gen;      /* newest subscriber's */
    ngx_atomic_t                    sub_live;     /* the one that applies */
    ngx_atomic_t                    precise;      /* slots EV_FRESH */
    ngx_atomic_t                    messages;
    ngx_atomic_t                    hashes;
    ngx_atomic_t                    rejected[NGX_HTTP_KV_AWARE_REJ_LAST];
    ngx_atomic_t                    resyncs;
} ngx_http_kv_aware_events_sh_t;


/* indexed by the enums above */
extern const char  *ngx_http_kv_aware_ev_state_names[];
extern const char  *ngx_http_kv_aware_reject_keys[];
extern const char  *ngx_http_kv_aware_reject_texts[];



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
char *ngx_http_kv_aware_events_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_http_kv_aware_subscription.c: one subscriber, in the first worker */
ngx_int_t ngx_http_kv_aware_events_init_process(ngx_cycle_t *cycle);
void ngx_http_kv_aware_events_exit_process(ngx_cycle_t *cycle);

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
ngx_http_kv_aware_reject_e ngx_http_kv_aware_reject_class(
    kva_event_rc_e rc);


#endif /* _NGX_HTTP_KV_AWARE_EVENTS_H_INCLUDED_ */
