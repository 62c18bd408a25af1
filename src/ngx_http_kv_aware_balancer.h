/*
 * ngx_http_kv_aware_module: the balancer, round-robin's peers with our
 * choice of one.
 */

#ifndef _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"


/* the balancer's slice of the zone (ngx_http_kv_aware_zone.h) */

/* the upstream's routing counters */
typedef struct {
    ngx_atomic_t                    requests;
    ngx_atomic_t                    fallbacks;
    ngx_atomic_t                    fallback[NGX_HTTP_KV_AWARE_FALLBACK_LAST];
    /* servers chosen, by kva_why_e; requests with kv_aware_tokenize's ids */
    ngx_atomic_t                    chosen[KVA_WHY_LAST];
    ngx_atomic_t                    tokenized;
} ngx_http_kv_aware_routing_sh_t;


/* a server's, in its slot */
typedef struct {
    ngx_atomic_t                    routed;
    ngx_atomic_t                    blocks;
    ngx_atomic_t                    matched;
    kva_fill_t                      fill;         /* under the zone lock */
} ngx_http_kv_aware_routing_slot_t;


/* in-flight load a server carries, from this nginx instance */
struct ngx_http_kv_aware_load_s {
    ngx_atomic_t                    reqs;
    ngx_atomic_t                    blocks;
};


ngx_int_t ngx_http_kv_aware_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);

/* NGX_OK and the rank, NGX_DECLINED where no rank applies, NGX_ERROR */
ngx_int_t ngx_http_kv_aware_plan_rank(ngx_http_request_t *r,
    ngx_uint_t *rank);


#endif /* _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_ */
