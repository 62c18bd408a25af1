/*
 * ngx_http_kv_aware_module: kv_aware_prefill, the configuration of
 * disaggregated prefill and decode.
 *
 *     upstream prefill { server ...; kv_aware ...; }
 *     upstream decode  { server ...; kv_aware ...; }
 *
 *     location /v1/ {
 *         kv_aware_prefill prefill mode=header min_uncached=256;
 *         proxy_set_header x-prefiller-host-port $kv_aware_prefill_addr;
 *         proxy_pass http://decode;
 *     }
 *
 * Its own nginx module in the same library, so that its location
 * configuration, variables and header filter stay apart from the
 * balancer's.  What cannot work is refused once the whole configuration
 * is read (upstreams may come after the location that names them): the
 * prefill upstream missing or not kv_aware, a location that does not
 * proxy_pass to a kv_aware upstream, two upstreams whose blocks are keyed
 * differently (the decode server's match would not count the prefill
 * server's blocks), mode=vllm or mode=sglang without the uri of its
 * prefill leg, a parameter of a mode other than the one set.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_pd.h"


/* the locations with kv_aware_prefill, checked at the end */
typedef struct {
    ngx_array_t                     confs;        /* pd_conf_t * */
} ngx_http_kv_aware_pd_main_conf_t;


static void *ngx_http_kv_aware_pd_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_kv_aware_pd_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_kv_aware_pd_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_kv_aware_pd_conf_mode(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
static ngx_int_t ngx_http_kv_aware_pd_postconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_kv_aware_pd_check(ngx_conf_t *cf,
    ngx_http_kv_aware_pd_conf_t *pcf);
static ngx_http_kv_aware_srv_conf_t *ngx_http_kv_aware_pd_upstream(
    ngx_conf_t *cf, ngx_http_upstream_srv_conf_t *uscf);
static ngx_int_t ngx_http_kv_aware_pd_same_keys(ngx_conf_t *cf,
    ngx_http_kv_aware_pd_conf_t *pcf);


/*
 * The proxy module's location configuration starts with its upstream
 * configuration (ngx_http_proxy_loc_conf_t in every nginx we build for),
 * which holds the upstream{} the location's proxy_pass names.
 */
extern ngx_module_t  ngx_http_proxy_module;


static const char  *ngx_http_kv_aware_pd_modes[] = {
    "header", "vllm", "sglang", NULL
};


/* see docs/reference.md, "kv_aware_prefill" */
static ngx_http_kv_aware_param_t  ngx_http_kv_aware_prefill_params[] = {

    { ngx_string("mode"),
      ngx_http_kv_aware_pd_conf_mode,
      offsetof(ngx_http_kv_aware_pd_conf_t, mode),
      0, 0, "header" },

    /* tokens the decode server lacks, from which a prefill server helps */
    { ngx_string("min_uncached"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_pd_conf_t, min_uncached),
      0, 1LL << 30, "256" },

    /* mode=vllm and mode=sglang: the internal location of the prefill leg */
    { ngx_string("uri"),
      ngx_http_kv_aware_conf_str,
      offsetof(ngx_http_kv_aware_pd_conf_t, uri),
      0, 0, NULL },

    /*
     * mode=sglang: the port of the prefill servers' bootstrap server
     * (SGLang's --disaggregation-bootstrap-port), one for the whole pool,
     * as SGLang's router is given; SGLang's default when unset
     */
    { ngx_string("bootstrap_port"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_pd_conf_t, bootstrap_port),
      1, 65535, NULL },

    ngx_http_kv_aware_null_param
};


static ngx_command_t  ngx_http_kv_aware_pd_commands[] = {

    { ngx_string("kv_aware_prefill"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_kv_aware_pd_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_kv_aware_pd_module_ctx = {
    ngx_http_kv_aware_pd_add_variables,    /* preconfiguration */
    ngx_http_kv_aware_pd_postconfiguration, /* postconfiguration */

    ngx_http_kv_aware_pd_create_main_conf, /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_kv_aware_pd_create_loc_conf,  /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_kv_aware_pd_module = {
    NGX_MODULE_V1,
    &ngx_http_kv_aware_pd_module_ctx,      /* module context */
    ngx_http_kv_aware_pd_commands,         /* module directives */
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
ngx_http_kv_aware_pd_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_kv_aware_pd_main_conf_t  *pmcf;

    pmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_pd_main_conf_t));
    if (pmcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&pmcf->confs, cf->pool, 4,
                       sizeof(ngx_http_kv_aware_pd_conf_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return pmcf;
}


/*
 * Not merged: a location's own proxy_pass is what the directive was
 * checked against, so a nested location does not inherit it.
 */
static void *
ngx_http_kv_aware_pd_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_kv_aware_pd_conf_t  *pcf;

    pcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_pd_conf_t));
    if (pcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     pcf->name = { 0, NULL };
     *     pcf->prefill = NULL;
     *     pcf->decode = NULL;
     */

    return pcf;
}


static char *
ngx_http_kv_aware_pd_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kv_aware_pd_conf_t *pcf = conf;

    ngx_str_t                          *value;
    ngx_http_kv_aware_pd_conf_t       **push;
    ngx_http_kv_aware_pd_main_conf_t   *pmcf;

    if (pcf->name.len) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0
        || ngx_strlchr(value[1].data, value[1].data + value[1].len, '=')
           != NULL)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: invalid upstream \"%V\", expected the name "
                           "of a kv_aware upstream, then name=value "
                           "parameters", &value[0], &value[1]);
        return NGX_CONF_ERROR;
    }

    pcf->name = value[1];

    if (ngx_http_kv_aware_conf_defaults(cf, &value[0],
                                        ngx_http_kv_aware_prefill_params, pcf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_kv_aware_conf_params_from(cf, ngx_http_kv_aware_prefill_params,
                                           pcf, 2)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (pcf->mode != NGX_HTTP_KV_AWARE_PD_HEADER
        && (pcf->uri.len == 0 || pcf->uri.data[0] != '/'))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: mode=%s needs uri=, expected the uri of "
                           "an internal location that proxies to "
                           "$kv_aware_prefill_addr", &value[0],
                           ngx_http_kv_aware_pd_modes[pcf->mode]);
        return NGX_CONF_ERROR;
    }

    if (pcf->mode == NGX_HTTP_KV_AWARE_PD_HEADER && pcf->uri.len) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: uri= is for mode=vllm and mode=sglang, "
                           "expected no uri with mode=header", &value[0]);
        return NGX_CONF_ERROR;
    }

    if (pcf->mode != NGX_HTTP_KV_AWARE_PD_SGLANG && pcf->bootstrap_port) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: bootstrap_port= is for mode=sglang, "
                           "expected none with mode=%s", &value[0],
                           ngx_http_kv_aware_pd_modes[pcf->mode]);
        return NGX_CONF_ERROR;
    }

    if (pcf->bootstrap_port == 0) {
        pcf->bootstrap_port = NGX_HTTP_KV_AWARE_PD_BOOTSTRAP_PORT;
    }

    pcf->proxy = ngx_http_conf_get_module_loc_conf(cf, ngx_http_proxy_module);
    pcf->file = cf->conf_file->file.name.data;
    pcf->line = cf->conf_file->line;

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kv_aware_pd_module);

    push = ngx_array_push(&pmcf->confs);
    if (push == NULL) {
        return NGX_CONF_ERROR;
    }

    *push = pcf;

    return NGX_CONF_OK;
}


static char *
ngx_http_kv_aware_pd_conf_mode(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_uint_t  i;

    for (i = 0; ngx_http_kv_aware_pd_modes[i]; i++) {
        if (value->len == ngx_strlen(ngx_http_kv_aware_pd_modes[i])
            && ngx_strncmp(value->data, ngx_http_kv_aware_pd_modes[i],
                           value->len) == 0)
        {
            *(ngx_uint_t *) ((u_char *) conf + p->offset) = i;
            return NGX_CONF_OK;
        }
    }

    return "header, vllm or sglang";
}


/* the upstreams are all read and initialized by now */
static ngx_int_t
ngx_http_kv_aware_pd_postconfiguration(ngx_conf_t *cf)
{
    ngx_uint_t                          i, vllm, sglang;
    ngx_http_kv_aware_pd_conf_t       **pcfp;
    ngx_http_kv_aware_pd_main_conf_t   *pmcf;

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_kv_aware_pd_module);
    pcfp = pmcf->confs.elts;

    for (i = 0; i < pmcf->confs.nelts; i++) {
        if (ngx_http_kv_aware_pd_check(cf, pcfp[i]) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (pmcf->confs.nelts == 0) {
        return NGX_OK;
    }

    vllm = 0;
    sglang = 0;

    for (i = 0; i < pmcf->confs.nelts; i++) {
        vllm |= (pcfp[i]->mode == NGX_HTTP_KV_AWARE_PD_VLLM);
        sglang |= (pcfp[i]->mode == NGX_HTTP_KV_AWARE_PD_SGLANG);
    }

    if (vllm && ngx_http_kv_aware_pd_vllm_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (sglang && ngx_http_kv_aware_pd_sglang_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_kv_aware_pd_init_filter(cf);
}


static ngx_int_t
ngx_http_kv_aware_pd_check(ngx_conf_t *cf, ngx_http_kv_aware_pd_conf_t *pcf)
{
    ngx_uint_t                      i;
    ngx_http_upstream_conf_t       *ucf;
    ngx_http_upstream_srv_conf_t  **uscfp, *uscf;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_upstream_module);
    uscfp = umcf->upstreams.elts;
    uscf = NULL;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        /* an implicit upstream (proxy_pass http://host) has no srv_conf */
        if (uscfp[i]->srv_conf
            && uscfp[i]->host.len == pcf->name.len
            && ngx_strncasecmp(uscfp[i]->host.data, pcf->name.data,
                               pcf->name.len) == 0)
        {
            uscf = uscfp[i];
            break;
        }
    }

    if (uscf == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: no upstream \"%V\" in %s:%ui",
                      &pcf->name, pcf->file, pcf->line);
        return NGX_ERROR;
    }

    pcf->prefill = ngx_http_kv_aware_pd_upstream(cf, uscf);

    if (pcf->prefill == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: upstream \"%V\" is not kv_aware, "
                      "expected one with the kv_aware directive, in %s:%ui",
                      &pcf->name, pcf->file, pcf->line);
        return NGX_ERROR;
    }

    ucf = pcf->proxy;

    if (ucf == NULL || ucf->upstream == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: the location has no proxy_pass to "
                      "an upstream{}, expected one to the kv_aware upstream "
                      "of the decode servers, in %s:%ui",
                      pcf->file, pcf->line);
        return NGX_ERROR;
    }

    pcf->decode = ngx_http_kv_aware_pd_upstream(cf, ucf->upstream);

    if (pcf->decode == NULL) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: the location proxies to \"%V\", "
                      "which is not a kv_aware upstream, expected the "
                      "kv_aware upstream of the decode servers, in %s:%ui",
                      &ucf->upstream->host, pcf->file, pcf->line);
        return NGX_ERROR;
    }

    /* x-prefiller-host-port names a server, not one of its ranks */
    if (pcf->prefill->data_parallel > 1) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: upstream \"%V\" has data_parallel="
                      "%ui, which $kv_aware_prefill_addr cannot name, "
                      "expected data_parallel=1 in the prefill upstream, "
                      "in %s:%ui",
                      &pcf->name, pcf->prefill->data_parallel,
                      pcf->file, pcf->line);
        return NGX_ERROR;
    }

    return ngx_http_kv_aware_pd_same_keys(cf, pcf);
}


/* the kv_aware configuration of an upstream{}, NULL: not kv_aware */
static ngx_http_kv_aware_srv_conf_t *
ngx_http_kv_aware_pd_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *uscf)
{
    ngx_http_kv_aware_srv_conf_t  *kcf;

    if (uscf->srv_conf == NULL) {
        return NULL;
    }

    kcf = ngx_http_conf_upstream_srv_conf(uscf, ngx_http_kv_aware_module);

    if (kcf == NULL || kcf->shm_zone == NULL || kcf->uscf != uscf) {
        return NULL;
    }

    return kcf;
}


/*
 * The split compares what the decode server holds with the prompt's
 * blocks and looks the same blocks up among the prefill servers: both
 * upstreams must key them alike.
 */
static ngx_int_t
ngx_http_kv_aware_pd_same_keys(ngx_conf_t *cf,
    ngx_http_kv_aware_pd_conf_t *pcf)
{
    static const char  *keys[] = { "text", "tokens" };

    ngx_http_kv_aware_srv_conf_t  *p, *d;

    p = pcf->prefill;
    d = pcf->decode;

    if (p->keys != d->keys) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: upstream \"%V\" has keys=%s and "
                      "\"%V\" keys=%s, expected the same keys in both, "
                      "in %s:%ui", &p->upstream, keys[p->keys],
                      &d->upstream, keys[d->keys], pcf->file, pcf->line);
        return NGX_ERROR;
    }

    if (p->block_size != d->block_size) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: upstream \"%V\" has block_size=%uz "
                      "and \"%V\" block_size=%uz, expected the same "
                      "block_size in both, in %s:%ui", &p->upstream,
                      p->block_size, &d->upstream, d->block_size,
                      pcf->file, pcf->line);
        return NGX_ERROR;
    }

    if (p->keys == NGX_HTTP_KV_AWARE_KEYS_TOKENS
        && p->block_tokens != d->block_tokens)
    {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "kv_aware_prefill: upstream \"%V\" has block_tokens="
                      "%ui and \"%V\" block_tokens=%ui, expected the same "
                      "block_tokens in both, in %s:%ui", &p->upstream,
                      p->block_tokens, &d->upstream, d->block_tokens,
                      pcf->file, pcf->line);
        return NGX_ERROR;
    }

    return NGX_OK;
}
