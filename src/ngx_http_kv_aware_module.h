/*
 * ngx_http_kv_aware_module: KV-cache-aware upstream balancing for LLM
 * inference servers.  Declarations shared by the nginx-facing files.
 */

#ifndef _NGX_HTTP_KV_AWARE_MODULE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "kva_index.h"
#include "kva_score.h"


#define NGX_HTTP_KV_AWARE_NAME_LEN      64     /* "ip:port", room for IPv6 */
#define NGX_HTTP_KV_AWARE_GENERATIONS   8      /* load tables kept on reload */

/* index clock: 16 ms ticks, wraps after 2.2 years, compared unsigned */
#define NGX_HTTP_KV_AWARE_TICK_SHIFT    4
#define ngx_http_kv_aware_ticks(ms)                                           \
    ((uint32_t) ((ms) >> NGX_HTTP_KV_AWARE_TICK_SHIFT))


/*
 * Each enum of names is written once, as a list: X(id, key) or, with a
 * log phrase, X(id, key, text).  The list makes the enum and the name
 * tables, so that the logs, $kv_aware_reason and the status keys cannot
 * drift apart from the values.
 */
#define NGX_HTTP_KV_AWARE_ENUM2(id, key)          NGX_HTTP_KV_AWARE_##id,
#define NGX_HTTP_KV_AWARE_KEY2(id, key)           key,
#define NGX_HTTP_KV_AWARE_ENUM3(id, key, text)    NGX_HTTP_KV_AWARE_##id,
#define NGX_HTTP_KV_AWARE_KEY3(id, key, text)     key,
#define NGX_HTTP_KV_AWARE_TEXT3(id, key, text)    text,


/* why a request was routed by load alone, for $kv_aware_reason */
#define NGX_HTTP_KV_AWARE_FALLBACKS(X)                                        \
    X(ROUTED, "")                                                             \
    X(NO_BODY, "no_body")                                                     \
    X(UNBUFFERED, "unbuffered")                                               \
    X(TOO_LARGE, "too_large")                                                 \
    X(FILE_ERROR, "file_error")                                               \
    X(NOT_JSON, "not_json")                                                   \
    X(BAD_UTF8, "bad_utf8")                                                   \
    X(TOO_DEEP, "too_deep")                                                   \
    X(NO_PROMPT, "no_prompt")                                                 \
    X(NO_MEMORY, "no_memory")

typedef enum {
    NGX_HTTP_KV_AWARE_FALLBACKS(NGX_HTTP_KV_AWARE_ENUM2)
    NGX_HTTP_KV_AWARE_FALLBACK_LAST
} ngx_http_kv_aware_fallback_e;


/* in-flight load a server carries, from this nginx instance */
typedef struct {
    ngx_atomic_t                    reqs;
    ngx_atomic_t                    blocks;
} ngx_http_kv_aware_load_t;


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
    X(REJ_FLOOD, "flood", "flood")

typedef enum {
    NGX_HTTP_KV_AWARE_REJECTS(NGX_HTTP_KV_AWARE_ENUM3)
    NGX_HTTP_KV_AWARE_REJ_LAST
} ngx_http_kv_aware_reject_e;


/* one server of the upstream, kept across reloads by its name */
typedef struct {
    u_char                          name[NGX_HTTP_KV_AWARE_NAME_LEN];
    size_t                          name_len;
    ngx_atomic_t                    routed;
    ngx_atomic_t                    blocks;
    ngx_atomic_t                    matched;

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
} ngx_http_kv_aware_slot_t;


/* the Redis link, as the status page reports it */
#define NGX_HTTP_KV_AWARE_REDIS_STATES(X)                                     \
    X(REDIS_OFF, "off")                                                       \
    X(REDIS_CONNECTING, "connecting")                                         \
    X(REDIS_UP, "up")                                                         \
    X(REDIS_DOWN, "down")

typedef enum {
    NGX_HTTP_KV_AWARE_REDIS_STATES(NGX_HTTP_KV_AWARE_ENUM2)
    NGX_HTTP_KV_AWARE_REDIS_LAST
} ngx_http_kv_aware_redis_state_e;


/* the zone header, in shpool->data */
typedef struct {
    size_t                          block_size;   /* hashes depend on it */
    ngx_uint_t                      generation;   /* bumped on each reload */
    ngx_atomic_t                    sub_gen;      /* newest subscriber's */
    ngx_atomic_t                    sub_live;     /* the one that applies */
    ngx_atomic_t                    requests;
    ngx_atomic_t                    fallbacks;

    ngx_atomic_t                    precise;      /* slots EV_FRESH */
    ngx_uint_t                      redis_state;
    ngx_atomic_t                    redis_connects;
    ngx_atomic_t                    redis_failures;
    ngx_atomic_t                    ev_messages;
    ngx_atomic_t                    ev_hashes;
    ngx_atomic_t                    ev_rejected[NGX_HTTP_KV_AWARE_REJ_LAST];
    ngx_atomic_t                    resyncs;

    ngx_http_kv_aware_slot_t        slots[KVA_MAX_SLOTS];
    ngx_http_kv_aware_load_t        load[NGX_HTTP_KV_AWARE_GENERATIONS]
                                        [KVA_MAX_SLOTS];
    kva_index_t                    *index;
    size_t                          index_size;
} ngx_http_kv_aware_shctx_t;


typedef struct ngx_http_kv_aware_redis_s  ngx_http_kv_aware_redis_t;


/* kv_aware_events: where the upstream's KV events come from */
typedef struct {
    ngx_str_t                       addr_text;    /* for messages */
    u_char                          ip[NGX_SOCKADDR_STRLEN + 1];
    ngx_uint_t                      port;
    ngx_str_t                       channel;      /* NUL-terminated */
    ngx_str_t                       resync_channel;
    ngx_str_t                       user;
    ngx_str_t                       password;
    ngx_flag_t                      pattern;
    ngx_msec_t                      connect_timeout;
    ngx_msec_t                      read_timeout;
    ngx_msec_t                      heartbeat;
    ngx_msec_t                      spec_ttl;
    size_t                          max_message;
    ngx_uint_t                      max_hashes;
    ngx_uint_t                      max_events;
    ngx_uint_t                      max_rate;     /* messages per second */
    size_t                          server_bytes; /* a second, per server */
    ngx_uint_t                      server_hashes;

    /* the subscribing worker's own state */
    ngx_http_kv_aware_redis_t      *redis;
    ngx_event_t                     tick;
    ngx_event_t                     handover;     /* old cycle, exiting */
    ngx_msec_t                      handover_start;
    ngx_uint_t                      handover_last; /* the tick after */
    ngx_msec_t                      took_over;    /* from a live older */
    ngx_msec_t                      rate_start;
    ngx_uint_t                      rate_count;
    ngx_uint_t                      scanned;      /* entries, this window */
    size_t                          srv_bytes[KVA_MAX_SLOTS];
    ngx_uint_t                      srv_hashes[KVA_MAX_SLOTS];
    ngx_msec_t                      logged[NGX_HTTP_KV_AWARE_REJ_LAST];
} ngx_http_kv_aware_events_conf_t;


typedef struct {
    size_t                          block_size;
    size_t                          index_size;
    size_t                          max_body;
    ngx_msec_t                      learned_ttl;
    kva_score_conf_t                score;

    ngx_shm_zone_t                 *shm_zone;
    ngx_http_kv_aware_shctx_t      *sh;
    ngx_slab_pool_t                *shpool;
    ngx_http_kv_aware_load_t       *load;         /* this cycle's table */
    ngx_http_kv_aware_events_conf_t  *events;     /* NULL: no events */

    ngx_str_t                       upstream;     /* for log messages */
    ngx_array_t                    *peer_names;   /* ngx_str_t, primary 1st */
    ngx_uint_t                      nprimary;
    ngx_uint_t                      npeers;       /* entries of slot_of */
    u_char                         *slot_of;      /* peer number -> slot */
    ngx_uint_t                      generation;   /* this cycle's, >= 1 */
    ngx_msec_t                      logged_peer;  /* peer beyond slot_of */
} ngx_http_kv_aware_srv_conf_t;


/* per request, shared by all tries and read by the variables */
typedef struct {
    uint64_t                       *hashes;
    uint32_t                       *found;        /* index hints, per block */
    uint32_t                        nblocks;
    uint32_t                        matched;
    ngx_http_kv_aware_fallback_e    fallback;
    kva_why_e                       why;
    unsigned                        decided:1;
} ngx_http_kv_aware_ctx_t;


extern ngx_module_t  ngx_http_kv_aware_module;

/* indexed by the enums above */
extern const char  *ngx_http_kv_aware_fallback_names[];
extern const char  *ngx_http_kv_aware_ev_state_names[];
extern const char  *ngx_http_kv_aware_reject_keys[];
extern const char  *ngx_http_kv_aware_reject_texts[];
extern const char  *ngx_http_kv_aware_redis_state_names[];


ngx_int_t ngx_http_kv_aware_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);
ngx_int_t ngx_http_kv_aware_init_zone(ngx_shm_zone_t *shm_zone, void *data);
ngx_int_t ngx_http_kv_aware_prompt_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);
ngx_int_t ngx_http_kv_aware_add_variables(ngx_conf_t *cf);
char *ngx_http_kv_aware_events_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_kv_aware_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* events: what the subscriber hands over, in the subscribing worker */
void ngx_http_kv_aware_events_message(ngx_http_kv_aware_srv_conf_t *kcf,
    u_char *data, size_t len);
void ngx_http_kv_aware_events_subscribed(ngx_http_kv_aware_srv_conf_t *kcf);
void ngx_http_kv_aware_events_lost(ngx_http_kv_aware_srv_conf_t *kcf);
ngx_int_t ngx_http_kv_aware_events_handover(
    ngx_http_kv_aware_srv_conf_t *kcf);
ngx_int_t ngx_http_kv_aware_events_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);

/* the Redis link (ngx_http_kv_aware_redis.c, the one file with hiredis) */
ngx_int_t ngx_http_kv_aware_redis_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);
void ngx_http_kv_aware_redis_stop(ngx_http_kv_aware_srv_conf_t *kcf);
ngx_int_t ngx_http_kv_aware_redis_publish(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_str_t *channel, u_char *data, size_t len);
void ngx_http_kv_aware_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk);
void ngx_http_kv_aware_drop_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    uint64_t mask, unsigned srcs);
void ngx_http_kv_aware_set_precise(ngx_http_kv_aware_shctx_t *sh,
    uint64_t mask, ngx_uint_t on);
ngx_uint_t ngx_http_kv_aware_slot_by_name(ngx_http_kv_aware_shctx_t *sh,
    u_char *name, size_t len);


#endif /* _NGX_HTTP_KV_AWARE_MODULE_H_INCLUDED_ */
