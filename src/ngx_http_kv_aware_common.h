/*
 * ngx_http_kv_aware_module: KV-cache-aware upstream balancing for LLM
 * inference servers.  What every nginx-facing file shares: the module,
 * its upstream configuration and the per-request context (defined in
 * ngx_http_kv_aware_module.c).  This header has no .c of its own, so that
 * module.c can include every concern's header to register it while each
 * concern includes only this one: no include goes back up.
 */

#ifndef _NGX_HTTP_KV_AWARE_COMMON_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_COMMON_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "kva_score.h"


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


/*
 * why a request was routed by load alone, for $kv_aware_reason; the last
 * three, of an upstream with keys=tokens, are routed by its text keys
 */
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
    X(NO_MEMORY, "no_memory")                                                 \
    X(NO_TOKENS, "no_tokens")                                                 \
    X(TOKENIZE_FAILED, "tokenize_failed")                                     \
    X(TOKENIZE_TIMEOUT, "tokenize_timeout")

typedef enum {
    NGX_HTTP_KV_AWARE_FALLBACKS(NGX_HTTP_KV_AWARE_ENUM2)
    NGX_HTTP_KV_AWARE_FALLBACK_LAST
} ngx_http_kv_aware_fallback_e;


/* defined by zone.h, balancer_slice.h and events.h */
typedef struct ngx_http_kv_aware_shctx_s        ngx_http_kv_aware_shctx_t;
typedef struct ngx_http_kv_aware_load_s         ngx_http_kv_aware_load_t;
typedef struct ngx_http_kv_aware_events_conf_s  ngx_http_kv_aware_events_conf_t;
typedef struct ngx_http_kv_aware_scratch_s      ngx_http_kv_aware_scratch_t;


/*
 * A Redis node by a numeric address (hiredis' getaddrinfo() does not
 * block on it): the configuration's seeds and the cluster's nodes
 */
typedef struct {
    u_char                          ip[NGX_SOCKADDR_STRLEN + 1];
    ngx_uint_t                      port;
} ngx_http_kv_aware_redis_addr_t;


/* the key space of an upstream's blocks (keys=) */
#define NGX_HTTP_KV_AWARE_KEYS_TEXT     0
#define NGX_HTTP_KV_AWARE_KEYS_TOKENS   1


typedef struct {
    ngx_uint_t                      keys;
    size_t                          block_size;
    ngx_uint_t                      block_tokens;
    ngx_uint_t                      data_parallel; /* ranks a server */
    size_t                          index_size;
    size_t                          max_body;
    ngx_msec_t                      learned_ttl;
    ngx_uint_t                      learned_tokens;   /* 0: no budget */
    ngx_msec_t                      spec_ttl;     /* 0: no events */
    kva_score_conf_t                score;

    /* sessions (kv_aware session=): NULL, none */
    ngx_http_complex_value_t       *session;
    ngx_msec_t                      session_timeout;
    ngx_uint_t                      session_capacity;
    double                          session_margin;

    /* the prior of a server's prefill rate, blocks a second (ttft.c) */
    double                          ttft_rate;

    ngx_shm_zone_t                 *shm_zone;
    ngx_http_kv_aware_shctx_t      *sh;
    ngx_slab_pool_t                *shpool;
    ngx_http_kv_aware_load_t       *load;         /* this cycle's table */
    ngx_http_kv_aware_events_conf_t  *events;     /* NULL: no events */

    ngx_str_t                       upstream;     /* for log messages */
    ngx_http_upstream_srv_conf_t   *uscf;
    ngx_array_t                    *peer_names;   /* ngx_str_t, primary 1st */

    /*
     * This worker's map of the peer lists to the zone's slots: peer i of
     * the primary list, then of the backups, rank r is slot_of[i * ranks
     * + r]; the first npeers peers have one.  Made at start, and again
     * when the lists change at run time (ngx_http_kv_aware_members.c).
     */
    ngx_uint_t                      nprimary;
    ngx_uint_t                      npeers;
    uint16_t                       *slot_of;      /* KVA_MAX_SLOTS */
    ngx_uint_t                      map_config;   /* the lists' counter */
    ngx_msec_t                      map_time;
    unsigned                        dynamic:1;    /* zone: lists change */
    unsigned                        mapped:1;
    unsigned                        map_whole:1;  /* every peer read has one */
    ngx_uint_t                      generation;   /* this cycle's, >= 1 */
    ngx_msec_t                      logged_peer;  /* peer beyond slot_of */

    /* this worker's arrays for a choice (scratch.c); NULL: round-robin */
    ngx_http_kv_aware_scratch_t    *scratch;
    void                           *member_names;  /* members.c's */
} ngx_http_kv_aware_srv_conf_t;


/* a candidate: a server, or one data-parallel rank of it */
typedef struct {
    ngx_http_upstream_rr_peer_t       *peer;
    ngx_uint_t                         number;  /* in its peer list */
    ngx_uint_t                         slot;
    ngx_uint_t                         rank;
} ngx_http_kv_aware_pick_t;


/* per request, shared by all tries and read by the variables */
typedef struct {
    uint64_t                       *hashes;
    uint32_t                       *found;        /* index hints, per block */
    uint32_t                        nblocks;
    uint32_t                        matched;
    ngx_http_kv_aware_fallback_e    fallback;
    kva_why_e                       why;

    /* the tokenizer's ids (kv_aware_tokenize), NULL: none */
    uint32_t                       *ids;
    size_t                          nids;
    void                           *tokenize;     /* its state */

    /* the balancer's, made early when $kv_aware_dp_rank asks for it */
    void                           *peer_data;
    ngx_uint_t                      rank;         /* data-parallel rank */

    /*
     * the session's key (0: none) for the upstream session_of, and what
     * the last try made of it (ngx_http_kv_aware_session_e)
     */
    uint64_t                        session_key;
    void                           *session_of;
    ngx_uint_t                      session;

    /* the work a try was charged with until its answer begins (ttft.c) */
    ngx_http_kv_aware_srv_conf_t   *ttft_kcf;     /* NULL: none charged */
    ngx_uint_t                      ttft_slot;
    uint32_t                        ttft_own;     /* its uncached blocks */
    double                          ttft_rate;    /* predicted by, a s */
    unsigned                        ttft_body:1;  /* its first bytes due */

    unsigned                        hashed:1;
    unsigned                        decided:1;
} ngx_http_kv_aware_ctx_t;


extern ngx_module_t  ngx_http_kv_aware_module;


/* the request's context, made on first use; NULL: no memory */
ngx_http_kv_aware_ctx_t *ngx_http_kv_aware_module_request_ctx(
    ngx_http_request_t *r);


/* a core function's return code and what the shell counts it as */
typedef struct {
    ngx_uint_t                      rc;
    ngx_uint_t                      reason;
} ngx_http_kv_aware_rc_map_t;

/* the reason of rc in a table of n, or dflt where it has none */
ngx_uint_t ngx_http_kv_aware_module_rc_reason(
    const ngx_http_kv_aware_rc_map_t *map, ngx_uint_t n, ngx_uint_t rc,
    ngx_uint_t dflt);


#endif /* _NGX_HTTP_KV_AWARE_COMMON_H_INCLUDED_ */
