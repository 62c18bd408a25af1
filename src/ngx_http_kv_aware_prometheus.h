/*
 * ngx_http_kv_aware_module: kv_aware_status in the Prometheus text
 * exposition format (version 0.0.4).
 */

#ifndef _NGX_HTTP_KV_AWARE_PROMETHEUS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_PROMETHEUS_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_status_snapshot.h"


#define NGX_HTTP_KV_AWARE_PROMETHEUS_TYPE                                     \
    "text/plain; version=0.0.4; charset=utf-8"


/* the page of st, in a buffer of r's pool; NULL on an allocation failure */
ngx_buf_t *ngx_http_kv_aware_prometheus(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st);


#endif /* _NGX_HTTP_KV_AWARE_PROMETHEUS_H_INCLUDED_ */
