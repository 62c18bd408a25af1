/*
 * ngx_http_kv_aware_module: the variables of kv_aware_prefill:
 * $kv_aware_prefill_addr and $kv_aware_pd, which make the decision when
 * first read (ngx_http_kv_aware_pd.c), $kv_aware_request_id, the id
 * both legs of mode=vllm carry, and $kv_aware_bootstrap_room, the room
 * both legs of mode=sglang name.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_pd.h"


static ngx_int_t ngx_http_kv_aware_pd_addr_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_pd_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_pd_var_decision(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_e *outcome, ngx_str_t *addr);
static ngx_int_t ngx_http_kv_aware_pd_request_id_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_kv_aware_pd_room_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);


static ngx_http_variable_t  ngx_http_kv_aware_pd_vars[] = {

    /* for proxy_set_header x-prefiller-host-port: empty, no header */
    { ngx_string("kv_aware_prefill_addr"), NULL,
      ngx_http_kv_aware_pd_addr_var, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    /* split, aggregated:short, aggregated:cached, fallback:... */
    { ngx_string("kv_aware_pd"), NULL, ngx_http_kv_aware_pd_var, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    /* for proxy_set_header X-Request-Id on both legs of mode=vllm */
    { ngx_string("kv_aware_request_id"), NULL,
      ngx_http_kv_aware_pd_request_id_var, 0, 0, 0 },

    /* mode=sglang: the bootstrap_room of a split; empty: none */
    { ngx_string("kv_aware_bootstrap_room"), NULL,
      ngx_http_kv_aware_pd_room_var, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_kv_aware_pd_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_kv_aware_pd_vars; v->name.len; v++) {
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
ngx_http_kv_aware_pd_addr_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_int_t               rc;
    ngx_str_t               addr;
    ngx_http_kv_aware_pd_e  outcome;

    rc = ngx_http_kv_aware_pd_var_decision(r, &outcome, &addr);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        v->not_found = 1;
        return NGX_OK;
    }

    /* empty, never NULL: nginx's scripts copy it with memcpy() */
    v->len = addr.len;
    v->data = addr.len ? addr.data : (u_char *) "";
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_pd_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_int_t               rc;
    ngx_str_t               addr;
    ngx_http_kv_aware_pd_e  outcome;

    rc = ngx_http_kv_aware_pd_var_decision(r, &outcome, &addr);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ngx_strlen(ngx_http_kv_aware_pd_texts[outcome]);
    v->data = (u_char *) ngx_http_kv_aware_pd_texts[outcome];
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * A subrequest (mode=vllm's leg 1, whose proxy_pass names the prefill
 * server) reads its main request's decision, and never decides.
 */
static ngx_int_t
ngx_http_kv_aware_pd_var_decision(ngx_http_request_t *r,
    ngx_http_kv_aware_pd_e *outcome, ngx_str_t *addr)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    if (r == r->main) {
        return ngx_http_kv_aware_pd_decide(r, outcome, addr);
    }

    pctx = ngx_http_get_module_ctx(r->main, ngx_http_kv_aware_pd_module);

    if (pctx == NULL || !pctx->decided) {
        return NGX_DECLINED;
    }

    *outcome = pctx->outcome;
    *addr = pctx->addr;

    return NGX_OK;
}


/*
 * The id both legs carry (X-Request-Id): the client's own, or else one
 * made for the request, the main request's in a subrequest.
 */
static ngx_int_t
ngx_http_kv_aware_pd_request_id_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                      *p;
    ngx_uint_t                   i;
    ngx_list_part_t             *part;
    ngx_table_elt_t             *h;
    ngx_http_request_t          *m;
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    m = r->main;

    pctx = ngx_http_kv_aware_pd_request_ctx(m);
    if (pctx == NULL) {
        return NGX_ERROR;
    }

    if (pctx->request_id.len == 0) {
        part = &m->headers_in.headers.part;
        h = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (h[i].key.len == sizeof("X-Request-Id") - 1
                && ngx_strncasecmp(h[i].key.data, (u_char *) "X-Request-Id",
                                   h[i].key.len) == 0
                && h[i].value.len > 0 && h[i].value.len <= 128)
            {
                pctx->request_id = h[i].value;
                break;
            }
        }
    }

    /* 32 hex digits, as $request_id */
    if (pctx->request_id.len == 0) {
        p = ngx_pnalloc(m->pool, 32);
        if (p == NULL) {
            return NGX_ERROR;
        }

        ngx_sprintf(p, "%08xD%08xD%08xD%08xD",
                    (uint32_t) ngx_random(), (uint32_t) ngx_random(),
                    (uint32_t) ngx_random(), (uint32_t) ngx_random());

        pctx->request_id.data = p;
        pctx->request_id.len = 32;
    }

    v->len = pctx->request_id.len;
    v->data = pctx->request_id.data;
    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_pd_room_var(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_kv_aware_pd_ctx_t  *pctx;

    pctx = ngx_http_get_module_ctx(r->main, ngx_http_kv_aware_pd_module);

    if (pctx == NULL || pctx->room == 0) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->data = ngx_pnalloc(r->pool, NGX_INT64_LEN);
    if (v->data == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(v->data, "%uL", pctx->room) - v->data;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}
