/*
 * ngx_http_kv_aware_module: kv_aware_status, the status page: JSON, or
 * the Prometheus text format.
 */

#ifndef _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_


#include "ngx_http_kv_aware_module.h"
#include "kva_index.h"


char *ngx_http_kv_aware_status_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* index entries per slot and source, counted a chunk per lock hold */
void ngx_http_kv_aware_status_count(ngx_http_kv_aware_srv_conf_t *kcf,
    kva_slot_count_t counts[KVA_MAX_SLOTS]);


#endif /* _NGX_HTTP_KV_AWARE_STATUS_H_INCLUDED_ */
