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


/* why a request was routed by load alone, for $kv_aware_reason */
typedef enum {
    NGX_HTTP_KV_AWARE_ROUTED = 0,
    NGX_HTTP_KV_AWARE_NO_BODY,
    NGX_HTTP_KV_AWARE_UNBUFFERED,
    NGX_HTTP_KV_AWARE_TOO_LARGE,
    NGX_HTTP_KV_AWARE_FILE_ERROR,
    NGX_HTTP_KV_AWARE_NOT_JSON,
    NGX_HTTP_KV_AWARE_BAD_UTF8,
    NGX_HTTP_KV_AWARE_TOO_DEEP,
    NGX_HTTP_KV_AWARE_NO_PROMPT,
    NGX_HTTP_KV_AWARE_NO_MEMORY
} ngx_http_kv_aware_fallback_e;


/* in-flight load a server carries, from this nginx instance */
typedef struct {
    ngx_atomic_t                    reqs;
    ngx_atomic_t                    blocks;
} ngx_http_kv_aware_load_t;


/* what the module knows of a server's cache, from its events */
typedef enum {
    NGX_HTTP_KV_AWARE_EV_NONE = 0,      /* never heard from: learned only */
    NGX_HTTP_KV_AWARE_EV_FRESH,         /* events in sequence: precise */
    NGX_HTTP_KV_AWARE_EV_SYNCING,       /* a snapshot is arriving */
    NGX_HTTP_KV_AWARE_EV_DEGRADED,      /* events lost: resync asked */
    NGX_HTTP_KV_AWARE_EV_STALE          /* silent past the heartbeat */
} ngx_http_kv_aware_ev_state_e;


/* classes of rejected event messages, for the status page */
typedef enum {
    NGX_HTTP_KV_AWARE_REJ_MALFORMED = 0,
    NGX_HTTP_KV_AWARE_REJ_BAD_FIELD,
    NGX_HTTP_KV_AWARE_REJ_VERSION,
    NGX_HTTP_KV_AWARE_REJ_TOO_BIG,
    NGX_HTTP_KV_AWARE_REJ_UNKNOWN_SERVER,
    NGX_HTTP_KV_AWARE_REJ_FLOOD,
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
typedef enum {
    NGX_HTTP_KV_AWARE_REDIS_OFF = 0,
    NGX_HTTP_KV_AWARE_REDIS_CONNECTING,
    NGX_HTTP_KV_AWARE_REDIS_UP,
    NGX_HTTP_KV_AWARE_REDIS_DOWN
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
const char *ngx_http_kv_aware_fallback_name(
    ngx_http_kv_aware_fallback_e fallback);
void ngx_http_kv_aware_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk);
void ngx_http_kv_aware_drop_slots(ngx_http_kv_aware_srv_conf_t *kcf,
    uint64_t mask, unsigned srcs);
void ngx_http_kv_aware_set_precise(ngx_http_kv_aware_shctx_t *sh,
    uint64_t mask, ngx_uint_t on);
ngx_uint_t ngx_http_kv_aware_slot_by_name(ngx_http_kv_aware_shctx_t *sh,
    u_char *name, size_t len);


#endif /* _NGX_HTTP_KV_AWARE_MODULE_H_INCLUDED_ */
