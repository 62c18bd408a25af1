/*
 * ngx_http_kv_aware_module: the kv_aware directive and module definition.
 */

#include "ngx_http_kv_aware_module.h"


#define NGX_HTTP_KV_AWARE_MIN_INDEX   (256 * 1024)


static void *ngx_http_kv_aware_create_srv_conf(ngx_conf_t *cf);
static ngx_int_t ngx_http_kv_aware_preconfiguration(ngx_conf_t *cf);
static char *ngx_http_kv_aware(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kv_aware_parse(ngx_conf_t *cf,
    ngx_http_kv_aware_srv_conf_t *kcf, ngx_str_t *param);
static char *ngx_http_kv_aware_bad_value(ngx_conf_t *cf, const char *name,
    ngx_str_t *value, const char *expected);


static ngx_command_t  ngx_http_kv_aware_commands[] = {

    { ngx_string("kv_aware"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_kv_aware,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_kv_aware_module_ctx = {
    ngx_http_kv_aware_preconfiguration,    /* preconfiguration */
    NULL,                                  /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_kv_aware_create_srv_conf,     /* create server configuration */
    NULL,                                  /* merge server configuration */

    NULL,                                  /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_kv_aware_module = {
    NGX_MODULE_V1,
    &ngx_http_kv_aware_module_ctx,         /* module context */
    ngx_http_kv_aware_commands,            /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static void *
ngx_http_kv_aware_create_srv_conf(ngx_conf_t *cf)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_srv_conf_t));
    if (kcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     kcf->shm_zone = NULL;
     *     kcf->peer_names = NULL;
     */

    kcf->block_size = NGX_CONF_UNSET_SIZE;

    return kcf;
}


static ngx_int_t
ngx_http_kv_aware_preconfiguration(ngx_conf_t *cf)
{
    return ngx_http_kv_aware_add_variables(cf);
}


static char *
ngx_http_kv_aware(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kv_aware_srv_conf_t *kcf = conf;

    u_char                        *p;
    ngx_str_t                     *value, name;
    ngx_uint_t                     i;
    ngx_http_upstream_srv_conf_t  *uscf;

    if (kcf->block_size != NGX_CONF_UNSET_SIZE) {
        return "is duplicate";
    }

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (uscf->peer.init_upstream) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "load balancing method redefined");
    }

    /* defaults: see README, "Directives" */
    kcf->block_size = 256;
    kcf->index_size = 32 * 1024 * 1024;
    kcf->max_body = 4 * 1024 * 1024;
    kcf->learned_ttl = 600 * 1000;
    kcf->score.overlap_weight = 2.0;
    kcf->score.imbalance = 32;
    kcf->score.imbalance_ratio = 1.5;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        if (ngx_http_kv_aware_parse(cf, kcf, &value[i]) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }
    }

    kcf->upstream = uscf->host;

    name.len = sizeof("kv_aware:") - 1 + uscf->host.len;
    name.data = ngx_pnalloc(cf->pool, name.len);
    if (name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    p = ngx_cpymem(name.data, "kv_aware:", sizeof("kv_aware:") - 1);
    ngx_memcpy(p, uscf->host.data, uscf->host.len);

    kcf->shm_zone = ngx_shared_memory_add(cf, &name, kcf->index_size,
                                          &ngx_http_kv_aware_module);
    if (kcf->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (kcf->shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "kv_aware: duplicate upstream \"%V\"", &uscf->host);
        return NGX_CONF_ERROR;
    }

    kcf->shm_zone->init = ngx_http_kv_aware_init_zone;
    kcf->shm_zone->data = kcf;

    uscf->peer.init_upstream = ngx_http_kv_aware_init_upstream;

    uscf->flags = NGX_HTTP_UPSTREAM_CREATE
                  |NGX_HTTP_UPSTREAM_WEIGHT
                  |NGX_HTTP_UPSTREAM_MAX_CONNS
                  |NGX_HTTP_UPSTREAM_MAX_FAILS
                  |NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
                  |NGX_HTTP_UPSTREAM_DOWN
                  |NGX_HTTP_UPSTREAM_BACKUP;

    return NGX_CONF_OK;
}


static char *
ngx_http_kv_aware_parse(ngx_conf_t *cf, ngx_http_kv_aware_srv_conf_t *kcf,
    ngx_str_t *param)
{
    u_char     *eq;
    size_t      size;
    ngx_int_t   n;
    ngx_str_t   name, v;

    eq = ngx_strlchr(param->data, param->data + param->len, '=');

    if (eq == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "kv_aware: invalid parameter \"%V\", "
                           "expected name=value", param);
        return NGX_CONF_ERROR;
    }

    name.data = param->data;
    name.len = eq - param->data;
    v.data = eq + 1;
    v.len = param->data + param->len - v.data;

    if (name.len == 10 && ngx_strncmp(name.data, "block_size", 10) == 0) {
        size = ngx_parse_size(&v);

        if (size == (size_t) NGX_ERROR || size < 16 || size > 65536) {
            return ngx_http_kv_aware_bad_value(cf, "block_size", &v,
                                               "a size from 16 to 64k");
        }

        kcf->block_size = size;
        return NGX_CONF_OK;
    }

    if (name.len == 10 && ngx_strncmp(name.data, "index_size", 10) == 0) {
        size = ngx_parse_size(&v);

        if (size == (size_t) NGX_ERROR
            || size < NGX_HTTP_KV_AWARE_MIN_INDEX)
        {
            return ngx_http_kv_aware_bad_value(cf, "index_size", &v,
                                               "a size of at least 256k");
        }

        kcf->index_size = size;
        return NGX_CONF_OK;
    }

    if (name.len == 8 && ngx_strncmp(name.data, "max_body", 8) == 0) {
        size = ngx_parse_size(&v);

        if (size == (size_t) NGX_ERROR || size < 1024) {
            return ngx_http_kv_aware_bad_value(cf, "max_body", &v,
                                               "a size of at least 1k");
        }

        kcf->max_body = size;
        return NGX_CONF_OK;
    }

    if (name.len == 11 && ngx_strncmp(name.data, "learned_ttl", 11) == 0) {
        n = ngx_parse_time(&v, 0);

        if (n == NGX_ERROR || n < 1000 || n > 30 * 86400 * 1000LL) {
            return ngx_http_kv_aware_bad_value(cf, "learned_ttl", &v,
                                               "a time from 1s to 30d");
        }

        kcf->learned_ttl = (ngx_msec_t) n;
        return NGX_CONF_OK;
    }

    if (name.len == 14 && ngx_strncmp(name.data, "overlap_weight", 14) == 0)
    {
        n = ngx_atofp(v.data, v.len, 3);

        if (n == NGX_ERROR || n > 1000 * 1000) {
            return ngx_http_kv_aware_bad_value(cf, "overlap_weight", &v,
                                               "a number from 0 to 1000");
        }

        kcf->score.overlap_weight = n / 1000.0;
        return NGX_CONF_OK;
    }

    if (name.len == 9 && ngx_strncmp(name.data, "imbalance", 9) == 0) {
        n = ngx_atoi(v.data, v.len);

        if (n == NGX_ERROR || n > 1000000) {
            return ngx_http_kv_aware_bad_value(cf, "imbalance", &v,
                                               "a number of requests, "
                                               "0 to turn the gate off");
        }

        kcf->score.imbalance = (uint32_t) n;
        return NGX_CONF_OK;
    }

    if (name.len == 15 && ngx_strncmp(name.data, "imbalance_ratio", 15) == 0)
    {
        n = ngx_atofp(v.data, v.len, 3);

        if (n == NGX_ERROR || n < 1000 || n > 1000 * 1000) {
            return ngx_http_kv_aware_bad_value(cf, "imbalance_ratio", &v,
                                               "a number from 1 to 1000");
        }

        kcf->score.imbalance_ratio = n / 1000.0;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "kv_aware: invalid parameter \"%V\"", &name);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_kv_aware_bad_value(ngx_conf_t *cf, const char *name,
    ngx_str_t *value, const char *expected)
{
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "kv_aware: invalid %s \"%V\", expected %s",
                       name, value, expected);

    return NGX_CONF_ERROR;
}
