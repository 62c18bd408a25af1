/*
 * ngx_http_kv_aware_module: $kv_aware_* variables.
 */

#ifndef _NGX_HTTP_KV_AWARE_VARIABLES_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_VARIABLES_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


ngx_int_t ngx_http_kv_aware_variables_add(ngx_conf_t *cf);


#endif /* _NGX_HTTP_KV_AWARE_VARIABLES_H_INCLUDED_ */
