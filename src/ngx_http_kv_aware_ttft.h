/*
 * ngx_http_kv_aware_module: placement by predicted time to first token.
 */

#ifndef _NGX_HTTP_KV_AWARE_TTFT_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_TTFT_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "kva_score.h"


/* the header filter that learns from each answer, at postconfiguration */
ngx_int_t ngx_http_kv_aware_ttft_init(ngx_conf_t *cf);

/* kv_aware cost=load|ttft */
char *ngx_http_kv_aware_ttft_conf_cost(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);

/*
 * a try to slot charged with the blocks of a prompt of nblocks that the
 * chosen candidate c computes (its misses, slower tiers' copies as their
 * share of a miss); the zone's lock held
 */
void ngx_http_kv_aware_ttft_charge_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_uint_t slot, const kva_candidate_t *c,
    uint32_t nblocks);

/* the try's charge given back, without learning (a failed try, its end) */
void ngx_http_kv_aware_ttft_release(ngx_http_kv_aware_ctx_t *ctx);


#endif /* _NGX_HTTP_KV_AWARE_TTFT_H_INCLUDED_ */
