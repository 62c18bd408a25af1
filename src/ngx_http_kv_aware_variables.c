/*
 * ngx_http_kv_aware_module: $kv_aware_* variables, for the access log.
 */

#include "ngx_http_kv_aware_module.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_balancer.h"
#include "ngx_http_kv_aware_variables.h"


static ngx_int_t ngx_http_kv_aware_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_reason(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_dp_rank(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);


static ngx_http_variable_t  ngx_http_kv_aware_vars[] = {

    { ngx_string("kv_aware_blocks"), NULL, ngx_http_kv_aware_number,
      offsetof(ngx_http_kv_aware_ctx_t, nblocks),
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kv_aware_matched"), NULL, ngx_http_kv_aware_number,
      offsetof(ngx_http_kv_aware_ctx_t, matched),
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("kv_aware_reason"), NULL, ngx_http_kv_aware_reason, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    /* for proxy_set_header X-data-parallel-rank: empty, no header */
    { ngx_string("kv_aware_dp_rank"), NULL, ngx_http_kv_aware_dp_rank, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_kv_aware_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_kv_aware_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                   *p;
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT32_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%uD", *(uint32_t *) ((u_char *) ctx + data))
             - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}


/* affinity, load, gate, or fallback:<cause> when the prompt was unusable */
static ngx_int_t
ngx_http_kv_aware_reason(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                   *p;
    const char               *why;
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx == NULL || !ctx->decided) {
        v->not_found = 1;
        return NGX_OK;
    }

    if (ctx->fallback == NGX_HTTP_KV_AWARE_ROUTED) {
        why = kva_score_why(ctx->why);
        v->len = ngx_strlen(why);
        v->data = (u_char *) why;

    } else {
        why = ngx_http_kv_aware_fallback_names[ctx->fallback];

        p = ngx_pnalloc(r->pool, sizeof("fallback:") - 1 + ngx_strlen(why));
        if (p == NULL) {
            return NGX_ERROR;
        }

        v->len = ngx_sprintf(p, "fallback:%s", why) - p;
        v->data = p;
    }

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * The data-parallel rank of the chosen server: read while the request to
 * the server is built, it makes the choice (the balancer's first try
 * follows it).  Not found where the upstream has no ranks.
 */
static ngx_int_t
ngx_http_kv_aware_dp_rank(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char      *p;
    ngx_int_t    rc;
    ngx_uint_t   rank;

    rc = ngx_http_kv_aware_plan_rank(r, &rank);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%ui", rank) - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}
