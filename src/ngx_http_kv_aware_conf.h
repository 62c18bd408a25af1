/*
 * ngx_http_kv_aware_module: name=value directive parameters, read from a
 * table per directive.  Defaults are written as they would be in the
 * configuration and go through the same parser, so a default cannot be
 * out of its own range.
 */

#ifndef _NGX_HTTP_KV_AWARE_CONF_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_CONF_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


#define NGX_HTTP_KV_AWARE_NO_MAX   0          /* max: no upper bound */

/* parameters read with ngx_http_kv_aware_conf_fixed() are in thousandths */
#define NGX_HTTP_KV_AWARE_FIXED(n)  ((int64_t) (n) * 1000)


typedef struct ngx_http_kv_aware_param_s  ngx_http_kv_aware_param_t;

/* NGX_CONF_OK, or what was expected instead of the value */
typedef char *(*ngx_http_kv_aware_param_pt)(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);

struct ngx_http_kv_aware_param_s {
    ngx_str_t                       name;
    ngx_http_kv_aware_param_pt      parse;
    size_t                          offset;
    int64_t                         min;
    int64_t                         max;
    char                           *def;          /* NULL: none */
};

#define ngx_http_kv_aware_null_param  { ngx_null_string, NULL, 0, 0, 0, NULL }


char *ngx_http_kv_aware_conf_params(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *params, void *conf);
char *ngx_http_kv_aware_conf_params_from(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *params, void *conf, ngx_uint_t first);
char *ngx_http_kv_aware_conf_defaults(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_http_kv_aware_param_t *params, void *conf);

char *ngx_http_kv_aware_conf_size(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_msec(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_uint(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_uint32(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_fixed(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_flag(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
char *ngx_http_kv_aware_conf_str(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);


#endif /* _NGX_HTTP_KV_AWARE_CONF_H_INCLUDED_ */
