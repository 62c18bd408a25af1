/*
 * ngx_http_kv_aware_module: sessions that stay where their context lives
 * (kv_aware session=): a session's requests go to the server (rank) it
 * is bound to, in the zone, unless the binding would hurt.
 */

#ifndef _NGX_HTTP_KV_AWARE_SESSION_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_SESSION_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_ranking.h"
#include "ngx_http_kv_aware_session_slice.h"


/* session=: a complex value, compiled */
char *ngx_http_kv_aware_session_conf(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);

/* what the zone grows by for its table, which zone.c makes; 0: none */
size_t ngx_http_kv_aware_session_size(ngx_http_kv_aware_srv_conf_t *kcf);

/* the request's session key, once (0: no session) */
void ngx_http_kv_aware_session_key(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);

/*
 * The candidate chosen: the session's server, or the usual choice when
 * there is no session or its binding yields (and is then moved); sets
 * ctx->why and ctx->session.  The zone's lock held.
 */
ngx_uint_t ngx_http_kv_aware_session_pick_locked(
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx,
    ngx_http_kv_aware_pick_t *picks, kva_candidate_t *cand, ngx_uint_t n);


#endif /* _NGX_HTTP_KV_AWARE_SESSION_H_INCLUDED_ */
