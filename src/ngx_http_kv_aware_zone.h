/*
 * ngx_http_kv_aware_module: the per-upstream shared memory zone, its
 * layout and the index clock.
 */

#ifndef _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_redis.h"

#include "kva_index.h"


typedef struct ngx_http_kv_aware_share_s  ngx_http_kv_aware_share_t;


#define NGX_HTTP_KV_AWARE_NAME_LEN      64     /* "ip:port", room for IPv6 */
#define NGX_HTTP_KV_AWARE_GENERATIONS   8      /* load tables kept on reload */

/* index clock: 16 ms ticks, wraps after 2.2 years, compared unsigned */
#define NGX_HTTP_KV_AWARE_TICK_SHIFT    4
#define ngx_http_kv_aware_ticks(ms)                                           \
    ((uint32_t) ((ms) >> NGX_HTTP_KV_AWARE_TICK_SHIFT))


/* in-flight load a server carries, from this nginx instance */
struct ngx_http_kv_aware_load_s {
    ngx_atomic_t                    reqs;
    ngx_atomic_t                    blocks;
};


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


/*
 * one server of the upstream (or one data-parallel rank of it: each has
 * its own cache), kept across reloads by its name and rank
 */
typedef struct {
    u_char                          name[NGX_HTTP_KV_AWARE_NAME_LEN];
    size_t                          name_len;
    ngx_uint_t                      rank;         /* data_parallel > 1 */
    ngx_atomic_t                    routed;
    ngx_atomic_t                    blocks;
    ngx_atomic_t                    matched;
    kva_fill_t                      fill;         /* under the zone lock */

    /* written by the one subscribing worker, read by all */
    ngx_uint_t                      ev_state;
    ngx_uint_t                      ev_has_seq;
    ngx_uint_t                      ev_synced;    /* nothing missed since */
    uint64_t                        ev_seq;
    ngx_msec_t                      ev_heard;     /* ngx_current_msec */
    ngx_msec_t                      ev_resync;    /* last resync asked */
    ngx_atomic_t                    ev_messages;
    ngx_atomic_t                    ev_hashes;
    ngx_atomic_t                    ev_gaps;
    ngx_uint_t                      ev_seq_gen;   /* subscriber of ev_seq */
    ngx_uint_t                      ev_has_load;
    uint32_t                        ev_waiting;
    uint32_t                        ev_running;
    uint32_t                        ev_kv_usage;  /* per mille */
    uint64_t                        ev_kv_tokens; /* its pool, 0: unsaid */
} ngx_http_kv_aware_slot_t;


/* the zone header, in shpool->data */
struct ngx_http_kv_aware_shctx_s {
    size_t                          block_size;   /* hashes depend on it */
    ngx_uint_t                      keys;         /* and on these */
    ngx_uint_t                      block_tokens;
    ngx_uint_t                      generation;   /* bumped on each reload */
    ngx_atomic_t                    sub_gen;      /* newest subscriber's */
    ngx_atomic_t                    sub_live;     /* the one that applies */
    ngx_atomic_t                    requests;
    ngx_atomic_t                    fallbacks;
    ngx_atomic_t                    fallback[NGX_HTTP_KV_AWARE_FALLBACK_LAST];

    ngx_atomic_t                    precise;      /* slots EV_FRESH */
    ngx_http_kv_aware_redis_stats_t  redis;       /* the link reports here */
    ngx_atomic_t                    ev_messages;
    ngx_atomic_t                    ev_hashes;
    ngx_atomic_t                    ev_rejected[NGX_HTTP_KV_AWARE_REJ_LAST];
    ngx_atomic_t                    resyncs;
    /* servers chosen, by kva_why_e; requests with kv_aware_tokenize's ids */
    ngx_atomic_t                    chosen[KVA_WHY_LAST];
    ngx_atomic_t                    tokenized;

    ngx_http_kv_aware_slot_t        slots[KVA_MAX_SLOTS];
    ngx_http_kv_aware_load_t        load[NGX_HTTP_KV_AWARE_GENERATIONS]
                                        [KVA_MAX_SLOTS];
    ngx_http_kv_aware_share_t      *share;        /* share=on's queue */

    /* servers that come and go (ngx_http_kv_aware_members.c) */
    uint64_t                        reserved;     /* slots of servers gone */
    ngx_uint_t                      map_gen;      /* the view that last */
    ngx_uint_t                      map_config;   /* changed the slots */

    kva_index_t                    *index;
    size_t                          index_size;
};


/* indexed by the enums above */
extern const char  *ngx_http_kv_aware_ev_state_names[];
extern const char  *ngx_http_kv_aware_reject_keys[];
extern const char  *ngx_http_kv_aware_reject_texts[];


ngx_int_t ngx_http_kv_aware_init_zone(ngx_shm_zone_t *shm_zone, void *data);
void ngx_http_kv_aware_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk);
void ngx_http_kv_aware_learn_budget(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_uint_t slot, kva_clock_t *clk);
void ngx_http_kv_aware_drop_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    uint64_t mask, unsigned srcs);
void ngx_http_kv_aware_forget_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    uint64_t mask);
void ngx_http_kv_aware_set_precise(ngx_http_kv_aware_shctx_t *sh,
    uint64_t mask, ngx_uint_t on);
ngx_uint_t ngx_http_kv_aware_slot_by_name(ngx_http_kv_aware_shctx_t *sh,
    u_char *name, size_t len, ngx_uint_t rank);


#endif /* _NGX_HTTP_KV_AWARE_ZONE_H_INCLUDED_ */
