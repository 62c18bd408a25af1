/*
 * ngx_http_kv_aware_module: the balancer's slice of the zone, its routing
 * counters and a server's in-flight load.
 *
 * It has no .c of its own: ngx_http_kv_aware_zone.h composes the slices
 * and the concern's .c reads the zone, so the slice lives apart from
 * both and includes neither.
 */

#ifndef _NGX_HTTP_KV_AWARE_BALANCER_SLICE_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_BALANCER_SLICE_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


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


#endif /* _NGX_HTTP_KV_AWARE_BALANCER_SLICE_H_INCLUDED_ */
