/*
 * ngx_http_kv_aware_module: the candidates of a choice and what each
 * weighs, for the balancer and for $kv_aware_ranking_NAME.
 */

#ifndef _NGX_HTTP_KV_AWARE_RANKING_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_RANKING_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_scratch.h"

#include "kva_index.h"


/* $kv_aware_ranking_NAME lists the best this many candidates */
#define NGX_HTTP_KV_AWARE_RANKING_TOP  16


/* the prompt's keys, once a request (counted then) */
void ngx_http_kv_aware_ranking_hash(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);

/* the servers a try may take, those of tried aside; the peers' lock held */
ngx_uint_t ngx_http_kv_aware_ranking_candidates(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_upstream_rr_peers_t *peers,
    ngx_uint_t base, uintptr_t *tried, ngx_http_kv_aware_pick_t *picks,
    time_t now);

/* what each holds and carries, into cand[]; the zone's lock held */
void ngx_http_kv_aware_ranking_weigh_locked(ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_http_kv_aware_ctx_t *ctx, ngx_http_kv_aware_pick_t *picks,
    ngx_uint_t n, kva_clock_t *clk, kva_candidate_t *cand);

/* "addr cost,addr cost,...", best first; NGX_DECLINED: no servers */
ngx_int_t ngx_http_kv_aware_ranking(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *out);


#endif /* _NGX_HTTP_KV_AWARE_RANKING_H_INCLUDED_ */
