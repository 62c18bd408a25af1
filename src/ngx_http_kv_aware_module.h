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


/* one server of the upstream, kept across reloads by its name */
typedef struct {
    u_char                          name[NGX_HTTP_KV_AWARE_NAME_LEN];
    size_t                          name_len;
    ngx_atomic_t                    routed;
    ngx_atomic_t                    blocks;
    ngx_atomic_t                    matched;
} ngx_http_kv_aware_slot_t;


/* the zone header, in shpool->data */
typedef struct {
    size_t                          block_size;   /* hashes depend on it */
    ngx_uint_t                      generation;   /* bumped on each reload */
    ngx_atomic_t                    requests;
    ngx_atomic_t                    fallbacks;
    ngx_http_kv_aware_slot_t        slots[KVA_MAX_SLOTS];
    ngx_http_kv_aware_load_t        load[NGX_HTTP_KV_AWARE_GENERATIONS]
                                        [KVA_MAX_SLOTS];
    kva_index_t                    *index;
    size_t                          index_size;
} ngx_http_kv_aware_shctx_t;


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

    ngx_str_t                       upstream;     /* for log messages */
    ngx_array_t                    *peer_names;   /* ngx_str_t, primary 1st */
    ngx_uint_t                      nprimary;
    u_char                         *slot_of;      /* peer number -> slot */
} ngx_http_kv_aware_srv_conf_t;


/* per request, shared by all tries and read by the variables */
typedef struct {
    uint64_t                       *hashes;
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
const char *ngx_http_kv_aware_fallback_name(
    ngx_http_kv_aware_fallback_e fallback);
void ngx_http_kv_aware_clock(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_clock_t *clk);


#endif /* _NGX_HTTP_KV_AWARE_MODULE_H_INCLUDED_ */
