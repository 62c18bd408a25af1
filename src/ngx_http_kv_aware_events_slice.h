/*
 * ngx_http_kv_aware_module: the event path's slice of the zone, what it
 * knows of each server's cache and the messages it rejected.
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_EVENTS_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_EVENTS_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"

#include "kva_slotset.h"


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
    uint64_t                        origin;       /* publisher followed */
    ngx_uint_t                      two_told;     /* second one logged */
} ngx_http_kv_aware_events_slot_t;


/* the upstream's */
typedef struct {
    ngx_atomic_t                    sub_gen;      /* newest subscriber's */
    ngx_atomic_t                    sub_live;     /* the one that applies */
    ngx_atomic_t                    precise[KVA_SLOT_WORDS]; /* EV_FRESH */
    ngx_atomic_t                    messages;
    ngx_atomic_t                    hashes;
    ngx_atomic_t                    rejected[NGX_HTTP_KV_AWARE_REJ_LAST];
    ngx_atomic_t                    resyncs;
} ngx_http_kv_aware_events_sh_t;


/* indexed by the enums above */
extern const char  *ngx_http_kv_aware_zone_ev_state_names[];
extern const char  *ngx_http_kv_aware_zone_reject_keys[];
extern const char  *ngx_http_kv_aware_zone_reject_texts[];


#endif /* _NGX_HTTP_KV_AWARE_EVENTS_SLICE_H_INCLUDED_ */
