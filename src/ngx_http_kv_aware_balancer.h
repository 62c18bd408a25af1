/*
 * ngx_http_kv_aware_module: the balancer, round-robin's peers with our
 * choice of one.
 */

#ifndef _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_balancer_slice.h"

#include "kva_index.h"


ngx_int_t ngx_http_kv_aware_balancer_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);

/* the server chosen before the first try; NGX_OK, NGX_DECLINED, NGX_ERROR */
ngx_int_t ngx_http_kv_aware_balancer_plan(ngx_http_request_t *r);

/* what a chosen slot will hold, into the index; the zone's lock held */
void ngx_http_kv_aware_balancer_learn_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_uint_t slot, uint32_t matched,
    kva_clock_t *clk);

/* NGX_OK and the rank, NGX_DECLINED where no rank applies, NGX_ERROR */
ngx_int_t ngx_http_kv_aware_balancer_plan_rank(ngx_http_request_t *r,
    ngx_uint_t *rank);


#endif /* _NGX_HTTP_KV_AWARE_BALANCER_H_INCLUDED_ */
