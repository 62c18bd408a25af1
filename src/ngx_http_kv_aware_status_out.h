/*
 * ngx_http_kv_aware_status_out: a status page written twice by the same
 * code, once to measure it and once into one buffer of that size, so that
 * neither renderer (JSON, Prometheus) guesses a size or grows a chain.
 */

#ifndef _NGX_HTTP_KV_AWARE_STATUS_OUT_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_STATUS_OUT_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_status_snapshot.h"


/* where the page goes; pos NULL: measuring */
typedef struct {
    u_char                            *pos;
    u_char                            *end;
    size_t                             size;
} ngx_http_kv_aware_status_out_t;


/* writes (or measures) the whole page from the copy */
typedef void (*ngx_http_kv_aware_status_fill_pt)(
    ngx_http_kv_aware_status_out_t *o, ngx_http_kv_aware_status_t *st);


ngx_buf_t *ngx_http_kv_aware_status_out_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st, ngx_http_kv_aware_status_fill_pt fill);
void ngx_http_kv_aware_status_out_str(ngx_http_kv_aware_status_out_t *o,
    const char *s);


#endif /* _NGX_HTTP_KV_AWARE_STATUS_OUT_H_INCLUDED_ */
