/*
 * ngx_http_kv_aware_module: name=value directive parameters.
 *
 * Every directive of the module reads its parameters with one table and
 * reports a bad one in one format:
 *
 *     kv_aware: invalid block_size "8", expected a size from 16 to 64k
 *     kv_aware_events: unknown parameter "chanel"
 *
 * The expected part is made from the parser and the table's range, so
 * the message cannot disagree with what is accepted.
 */

#include "ngx_http_kv_aware_conf.h"


/* how a range is written in a message */
typedef enum {
    NGX_HTTP_KV_AWARE_UNIT_NUMBER = 0,
    NGX_HTTP_KV_AWARE_UNIT_SIZE,
    NGX_HTTP_KV_AWARE_UNIT_MSEC,
    NGX_HTTP_KV_AWARE_UNIT_FIXED
} ngx_http_kv_aware_unit_e;


typedef struct {
    int64_t                         scale;
    char                           *suffix;
} ngx_http_kv_aware_suffix_t;


static char *ngx_http_kv_aware_conf_param(ngx_conf_t *cf,
    ngx_str_t *directive, ngx_http_kv_aware_param_t *p, ngx_str_t *value,
    void *conf);
static ngx_uint_t ngx_http_kv_aware_conf_in_range(
    ngx_http_kv_aware_param_t *p, int64_t n);
static char *ngx_http_kv_aware_conf_range(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, const char *what,
    ngx_http_kv_aware_unit_e unit);
static u_char *ngx_http_kv_aware_conf_value(u_char *buf, u_char *last,
    int64_t n, ngx_http_kv_aware_unit_e unit);
static char *ngx_http_kv_aware_conf_int(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, ngx_int_t *n);


static ngx_http_kv_aware_suffix_t  ngx_http_kv_aware_sizes[] = {
    { 1024 * 1024, "m" },
    { 1024, "k" },
    { 0, NULL }
};


static ngx_http_kv_aware_suffix_t  ngx_http_kv_aware_times[] = {
    { 86400 * 1000, "d" },
    { 3600 * 1000, "h" },
    { 60 * 1000, "m" },
    { 1000, "s" },
    { 0, NULL }
};


/* the directive's arguments after its name, each name=value */
char *
ngx_http_kv_aware_conf_params(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *params, void *conf)
{
    return ngx_http_kv_aware_conf_params_from(cf, params, conf, 1);
}


/* the same from the argument first on, after positional ones */
char *
ngx_http_kv_aware_conf_params_from(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *params, void *conf, ngx_uint_t first)
{
    u_char                     *eq;
    ngx_str_t                  *value, name, v;
    ngx_uint_t                  i;
    ngx_http_kv_aware_param_t  *p;

    value = cf->args->elts;

    for (i = first; i < cf->args->nelts; i++) {
        eq = ngx_strlchr(value[i].data, value[i].data + value[i].len, '=');

        if (eq == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%V: invalid parameter \"%V\", "
                               "expected name=value", &value[0], &value[i]);
            return NGX_CONF_ERROR;
        }

        name.data = value[i].data;
        name.len = eq - value[i].data;
        v.data = eq + 1;
        v.len = value[i].data + value[i].len - v.data;

        for (p = params; p->name.len; p++) {
            if (p->name.len == name.len
                && ngx_strncmp(p->name.data, name.data, name.len) == 0)
            {
                break;
            }
        }

        if (p->name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%V: unknown parameter \"%V\"",
                               &value[0], &name);
            return NGX_CONF_ERROR;
        }

        if (ngx_http_kv_aware_conf_param(cf, &value[0], p, &v, conf)
            != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


char *
ngx_http_kv_aware_conf_defaults(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_http_kv_aware_param_t *params, void *conf)
{
    ngx_str_t                   v;
    ngx_http_kv_aware_param_t  *p;

    for (p = params; p->name.len; p++) {
        if (p->def == NULL) {
            continue;
        }

        v.data = (u_char *) p->def;
        v.len = ngx_strlen(p->def);

        if (ngx_http_kv_aware_conf_param(cf, directive, p, &v, conf)
            != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_kv_aware_conf_param(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf)
{
    char  *rv;

    rv = p->parse(cf, p, value, conf);

    if (rv == NGX_CONF_OK) {
        return NGX_CONF_OK;
    }

    if (rv != NGX_CONF_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: invalid %V \"%V\", expected %s",
                           directive, &p->name, value, rv);
    }

    return NGX_CONF_ERROR;
}


char *
ngx_http_kv_aware_conf_size(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    size_t  size;

    size = ngx_parse_size(value);

    if (size == (size_t) NGX_ERROR
        || !ngx_http_kv_aware_conf_in_range(p, (int64_t) size))
    {
        return ngx_http_kv_aware_conf_range(cf, p, "a size",
                                            NGX_HTTP_KV_AWARE_UNIT_SIZE);
    }

    *(size_t *) ((u_char *) conf + p->offset) = size;

    return NGX_CONF_OK;
}


char *
ngx_http_kv_aware_conf_msec(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_int_t  n;

    n = value->len ? ngx_parse_time(value, 0) : NGX_ERROR;

    if (n == NGX_ERROR || !ngx_http_kv_aware_conf_in_range(p, n)) {
        return ngx_http_kv_aware_conf_range(cf, p, "a time",
                                            NGX_HTTP_KV_AWARE_UNIT_MSEC);
    }

    *(ngx_msec_t *) ((u_char *) conf + p->offset) = (ngx_msec_t) n;

    return NGX_CONF_OK;
}


char *
ngx_http_kv_aware_conf_uint(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    char       *rv;
    ngx_int_t   n;

    rv = ngx_http_kv_aware_conf_int(cf, p, value, &n);

    if (rv == NGX_CONF_OK) {
        *(ngx_uint_t *) ((u_char *) conf + p->offset) = (ngx_uint_t) n;
    }

    return rv;
}


char *
ngx_http_kv_aware_conf_uint32(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    char       *rv;
    ngx_int_t   n;

    rv = ngx_http_kv_aware_conf_int(cf, p, value, &n);

    if (rv == NGX_CONF_OK) {
        *(uint32_t *) ((u_char *) conf + p->offset) = (uint32_t) n;
    }

    return rv;
}


static char *
ngx_http_kv_aware_conf_int(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, ngx_int_t *n)
{
    *n = ngx_atoi(value->data, value->len);

    if (*n == NGX_ERROR || !ngx_http_kv_aware_conf_in_range(p, *n)) {
        return ngx_http_kv_aware_conf_range(cf, p, "a number",
                                            NGX_HTTP_KV_AWARE_UNIT_NUMBER);
    }

    return NGX_CONF_OK;
}


/* a number with up to 3 decimals, to a double */
char *
ngx_http_kv_aware_conf_fixed(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_int_t  n;

    n = ngx_atofp(value->data, value->len, 3);

    if (n == NGX_ERROR || !ngx_http_kv_aware_conf_in_range(p, n)) {
        return ngx_http_kv_aware_conf_range(cf, p, "a number",
                                            NGX_HTTP_KV_AWARE_UNIT_FIXED);
    }

    *(double *) ((u_char *) conf + p->offset) = n / 1000.0;

    return NGX_CONF_OK;
}


char *
ngx_http_kv_aware_conf_flag(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_flag_t  *fp;

    fp = (ngx_flag_t *) ((u_char *) conf + p->offset);

    if (value->len == 2 && ngx_strncmp(value->data, "on", 2) == 0) {
        *fp = 1;
        return NGX_CONF_OK;
    }

    if (value->len == 3 && ngx_strncmp(value->data, "off", 3) == 0) {
        *fp = 0;
        return NGX_CONF_OK;
    }

    return "on or off";
}


/* the value itself: NUL-terminated, since it ends an argument */
char *
ngx_http_kv_aware_conf_str(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    if (value->len == 0) {
        return "a non-empty value";
    }

    *(ngx_str_t *) ((u_char *) conf + p->offset) = *value;

    return NGX_CONF_OK;
}


static ngx_uint_t
ngx_http_kv_aware_conf_in_range(ngx_http_kv_aware_param_t *p, int64_t n)
{
    return n >= p->min && (p->max == NGX_HTTP_KV_AWARE_NO_MAX || n <= p->max);
}


/* "a size from 16 to 64k", "a number of at least 1", from the table */
static char *
ngx_http_kv_aware_conf_range(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    const char *what, ngx_http_kv_aware_unit_e unit)
{
    u_char  *buf, *last, *q;

    buf = ngx_pnalloc(cf->pool, NGX_MAX_ERROR_STR);
    if (buf == NULL) {
        return NGX_CONF_ERROR;
    }

    last = buf + NGX_MAX_ERROR_STR - 1;

    if (p->max == NGX_HTTP_KV_AWARE_NO_MAX) {
        q = ngx_slprintf(buf, last, "%s of at least ", what);
        q = ngx_http_kv_aware_conf_value(q, last, p->min, unit);

    } else {
        q = ngx_slprintf(buf, last, "%s from ", what);
        q = ngx_http_kv_aware_conf_value(q, last, p->min, unit);
        q = ngx_slprintf(q, last, " to ");
        q = ngx_http_kv_aware_conf_value(q, last, p->max, unit);
    }

    *q = '\0';

    return (char *) buf;
}


/* as it would be written in the configuration: 64k, 30d, 1.5 */
static u_char *
ngx_http_kv_aware_conf_value(u_char *buf, u_char *last, int64_t n,
    ngx_http_kv_aware_unit_e unit)
{
    ngx_http_kv_aware_suffix_t  *s;

    switch (unit) {

    case NGX_HTTP_KV_AWARE_UNIT_FIXED:
        if (n % 1000) {
            return ngx_slprintf(buf, last, "%L.%03L", n / 1000, n % 1000);
        }

        return ngx_slprintf(buf, last, "%L", n / 1000);

    case NGX_HTTP_KV_AWARE_UNIT_SIZE:
        s = ngx_http_kv_aware_sizes;
        break;

    case NGX_HTTP_KV_AWARE_UNIT_MSEC:
        s = ngx_http_kv_aware_times;
        break;

    default:
        return ngx_slprintf(buf, last, "%L", n);
    }

    for ( /* void */ ; s->scale; s++) {
        if (n && n % s->scale == 0) {
            return ngx_slprintf(buf, last, "%L%s", n / s->scale, s->suffix);
        }
    }

    return ngx_slprintf(buf, last, unit == NGX_HTTP_KV_AWARE_UNIT_MSEC
                                   ? "%Lms" : "%L", n);
}
