/*
 * ngx_http_kv_aware_status_out: a status page measured, then written
 * into one buffer (ngx_http_kv_aware_status_out.h).
 */

#include "ngx_http_kv_aware_status_out.h"


ngx_buf_t *
ngx_http_kv_aware_status_out_page(ngx_http_request_t *r,
    ngx_http_kv_aware_status_t *st, ngx_http_kv_aware_status_fill_pt fill)
{
    ngx_buf_t                       *b;
    ngx_http_kv_aware_status_out_t   out;

    ngx_memzero(&out, sizeof(ngx_http_kv_aware_status_out_t));

    fill(&out, st);

    b = ngx_create_temp_buf(r->pool, out.size);
    if (b == NULL) {
        return NULL;
    }

    out.pos = b->last;
    out.end = b->end;

    fill(&out, st);

    b->last = out.pos;

    return b;
}


void
ngx_http_kv_aware_status_out_str(ngx_http_kv_aware_status_out_t *o,
    const char *s)
{
    size_t  len;

    len = ngx_strlen(s);

    if (o->pos == NULL) {
        o->size += len;
        return;
    }

    len = ngx_min(len, (size_t) (o->end - o->pos));
    o->pos = ngx_cpymem(o->pos, s, len);
}
