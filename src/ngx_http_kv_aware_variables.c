/*
 * ngx_http_kv_aware_module: $kv_aware_* variables, for the access log.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_prompt.h"
#include "ngx_http_kv_aware_balancer.h"
#include "ngx_http_kv_aware_ranking.h"
#include "ngx_http_kv_aware_session_slice.h"
#include "ngx_http_kv_aware_variables.h"


static ngx_int_t ngx_http_kv_aware_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_reason(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_dp_rank(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_ranking_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_set_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_uint_t n);


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

    /* $kv_aware_ranking_NAME: upstream NAME's servers, best first */
    { ngx_string("kv_aware_ranking_"), NULL, ngx_http_kv_aware_ranking_var,
      0, NGX_HTTP_VAR_NOCACHEABLE|NGX_HTTP_VAR_PREFIX, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_kv_aware_variables_add(ngx_conf_t *cf)
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
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    return ngx_http_kv_aware_set_number(r, v,
                                        *(uint32_t *) ((u_char *) ctx + data));
}


/*
 * affinity, load, gate, or fallback:<cause> when the prompt was unusable;
 * session, or session:yielded:<cause>, for a request of a bound session
 */
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

    if (ctx->session != NGX_HTTP_KV_AWARE_SESS_NONE
        && ctx->session != NGX_HTTP_KV_AWARE_SESS_NEW)
    {
        why = ngx_http_kv_aware_session_texts[ctx->session];
        v->len = ngx_strlen(why);
        v->data = (u_char *) why;

    } else if (ctx->fallback == NGX_HTTP_KV_AWARE_ROUTED) {
        why = kva_score_why(ctx->why);
        v->len = ngx_strlen(why);
        v->data = (u_char *) why;

    } else {
        why = ngx_http_kv_aware_prompt_fallback_names[ctx->fallback];

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
    ngx_int_t    rc;
    ngx_uint_t   rank;

    rc = ngx_http_kv_aware_balancer_plan_rank(r, &rank);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        v->not_found = 1;
        return NGX_OK;
    }

    return ngx_http_kv_aware_set_number(r, v, rank);
}


static ngx_int_t
ngx_http_kv_aware_set_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_uint_t n)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%ui", n) - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}


/*
 * data is the variable's whole name: what follows the prefix names a
 * kv_aware upstream.  Not found for another name, or an upstream without
 * servers to rank.
 */
static ngx_int_t
ngx_http_kv_aware_ranking_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t *name = (ngx_str_t *) data;

    ngx_int_t                       rc;
    ngx_str_t                       upstream, out;
    ngx_uint_t                      i;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_main_conf_t  *umcf;

    upstream.data = name->data + sizeof("kv_aware_ranking_") - 1;
    upstream.len = name->len - (sizeof("kv_aware_ranking_") - 1);

    umcf = ngx_http_get_module_main_conf(r, ngx_http_upstream_module);
    uscfp = umcf->upstreams.elts;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        /* an implicit upstream (proxy_pass http://host) has no srv_conf */
        if (uscfp[i]->srv_conf == NULL
            || uscfp[i]->host.len != upstream.len
            || ngx_strncasecmp(uscfp[i]->host.data, upstream.data,
                               upstream.len) != 0)
        {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->shm_zone == NULL || kcf->uscf == NULL) {
            continue;
        }

        rc = ngx_http_kv_aware_ranking(r, kcf, &out);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_OK) {
            v->len = out.len;
            v->data = out.data;
            v->valid = 1;
            v->no_cacheable = 1;
            v->not_found = 0;
            return NGX_OK;
        }

        break;
    }

    v->not_found = 1;

    return NGX_OK;
}
