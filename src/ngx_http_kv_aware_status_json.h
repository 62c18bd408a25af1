/*
 * ngx_http_kv_aware_module: kv_aware_status as JSON.
 */

#ifndef _NGX_HTTP_KV_AWARE_STATUS_JSON_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_STATUS_JSON_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_status_snapshot.h"


/* the page of st, in a buffer of r's pool; NULL on an allocation failure */
ngx_buf_t *ngx_http_kv_aware_status_json_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st);


#endif /* _NGX_HTTP_KV_AWARE_STATUS_JSON_H_INCLUDED_ */
