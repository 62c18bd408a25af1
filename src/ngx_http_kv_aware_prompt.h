/*
 * ngx_http_kv_aware_module: request body -> prompt block hashes.
 */

#ifndef _NGX_HTTP_KV_AWARE_PROMPT_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_PROMPT_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


/* indexed by ngx_http_kv_aware_fallback_e */
extern const char  *ngx_http_kv_aware_prompt_fallback_names[];


u_char *ngx_http_kv_aware_prompt_request_body(ngx_http_request_t *r, size_t max,
    size_t *len, ngx_uint_t *copied, ngx_http_kv_aware_fallback_e *fallback);
ngx_int_t ngx_http_kv_aware_prompt_hashes(ngx_http_request_t *r,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_http_kv_aware_ctx_t *ctx);


#endif /* _NGX_HTTP_KV_AWARE_PROMPT_H_INCLUDED_ */
