/*
 * ngx_http_kv_aware_module: kv_aware_status, the status page: JSON, or
 * the Prometheus text format, chosen by the directive or the request.
 */

#ifndef _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


char *ngx_http_kv_aware_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


#endif /* _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_ */
