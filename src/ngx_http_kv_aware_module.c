/*
 * ngx_http_kv_aware_module: the kv_aware directive and module definition.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_zone.h"
#include "ngx_http_kv_aware_balancer.h"
#include "ngx_http_kv_aware_events.h"
#include "ngx_http_kv_aware_share.h"
#include "ngx_http_kv_aware_members.h"
#include "ngx_http_kv_aware_status.h"
#include "ngx_http_kv_aware_variables.h"
#include "ngx_http_kv_aware_tokenize.h"
#include "ngx_http_kv_aware_session.h"
#include "ngx_http_kv_aware_ttft.h"
#include "ngx_http_kv_aware_scratch.h"


static void *ngx_http_kv_aware_create_srv_conf(ngx_conf_t *cf);
static ngx_int_t ngx_http_kv_aware_preconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_kv_aware_postconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_kv_aware_init_process(ngx_cycle_t *cycle);
static char *ngx_http_kv_aware(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_kv_aware_conf_keys(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);


/* see docs/reference.md, "kv_aware" */
static ngx_http_kv_aware_param_t  ngx_http_kv_aware_params[] = {

    { ngx_string("keys"),
      ngx_http_kv_aware_conf_keys,
      offsetof(ngx_http_kv_aware_srv_conf_t, keys),
      0, 0, "text" },

    /* the engines' --block-size; read with keys=tokens only */
    { ngx_string("block_tokens"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_srv_conf_t, block_tokens),
      1, 65536, "16" },

    /* ranks of each server (X-data-parallel-rank), slots = servers x this */
    { ngx_string("data_parallel"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_srv_conf_t, data_parallel),
      1, KVA_MAX_SLOTS, "1" },

    { ngx_string("block_size"),
      ngx_http_kv_aware_conf_size,
      offsetof(ngx_http_kv_aware_srv_conf_t, block_size),
      16, 64 * 1024, "256" },

    { ngx_string("index_size"),
      ngx_http_kv_aware_conf_size,
      offsetof(ngx_http_kv_aware_srv_conf_t, index_size),
      256 * 1024, NGX_HTTP_KV_AWARE_NO_MAX, "32m" },

    { ngx_string("max_body"),
      ngx_http_kv_aware_conf_size,
      offsetof(ngx_http_kv_aware_srv_conf_t, max_body),
      1024, NGX_HTTP_KV_AWARE_NO_MAX, "4m" },

    { ngx_string("learned_ttl"),
      ngx_http_kv_aware_conf_msec,
      offsetof(ngx_http_kv_aware_srv_conf_t, learned_ttl),
      1000, 30 * 86400 * 1000LL, "10m" },

    /* a server's KV cache, the budget of what is learned of it */
    { ngx_string("learned_tokens"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_srv_conf_t, learned_tokens),
      0, 1LL << 40, "0" },

    { ngx_string("overlap_weight"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.overlap_weight),
      NGX_HTTP_KV_AWARE_FIXED(0), NGX_HTTP_KV_AWARE_FIXED(1000), "16" },

    /* 0 turns the gate off */
    { ngx_string("imbalance"),
      ngx_http_kv_aware_conf_uint32,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.imbalance),
      0, 1000000, "32" },

    { ngx_string("imbalance_ratio"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.imbalance_ratio),
      NGX_HTTP_KV_AWARE_FIXED(1), NGX_HTTP_KV_AWARE_FIXED(1000), "1.5" },

    /* a smaller match is placed by capacity; 0: any match draws */
    { ngx_string("affinity_min"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.affinity_min),
      NGX_HTTP_KV_AWARE_FIXED(0), NGX_HTTP_KV_AWARE_FIXED(1), "0.5" },

    /* a session's requests to the server it is bound to (session.c) */
    { ngx_string("session"),
      ngx_http_kv_aware_session_conf,
      offsetof(ngx_http_kv_aware_srv_conf_t, session),
      0, 0, NULL },

    { ngx_string("session_timeout"),
      ngx_http_kv_aware_conf_msec,
      offsetof(ngx_http_kv_aware_srv_conf_t, session_timeout),
      1000, 30 * 86400 * 1000LL, "10m" },

    { ngx_string("session_capacity"),
      ngx_http_kv_aware_conf_uint,
      offsetof(ngx_http_kv_aware_srv_conf_t, session_capacity),
      16, 16 * 1024 * 1024, "65536" },

    /* what a server costs: overlap against load, or the predicted TTFT */
    { ngx_string("cost"),
      ngx_http_kv_aware_ttft_conf_cost,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.cost),
      0, 0, "load" },

    /* the prior of a server's prefill rate, blocks a second (ttft.c) */
    { ngx_string("ttft_rate"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, ttft_rate),
      NGX_HTTP_KV_AWARE_FIXED(1), NGX_HTTP_KV_AWARE_FIXED(100000000),
      "1000" },

    /* a matched block in host memory, on disk: the share of a miss */
    { ngx_string("cpu_cost"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.tier_cost[0]),
      NGX_HTTP_KV_AWARE_FIXED(0), NGX_HTTP_KV_AWARE_FIXED(1), "0.25" },

    { ngx_string("disk_cost"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, score.tier_cost[1]),
      NGX_HTTP_KV_AWARE_FIXED(0), NGX_HTTP_KV_AWARE_FIXED(1), "0.5" },

    /* in the cost's units: blocks of work (cost=ttft: ms) */
    { ngx_string("session_margin"),
      ngx_http_kv_aware_conf_fixed,
      offsetof(ngx_http_kv_aware_srv_conf_t, session_margin),
      NGX_HTTP_KV_AWARE_FIXED(0), NGX_HTTP_KV_AWARE_FIXED(1000000), "256" },

    ngx_http_kv_aware_null_param
};


static ngx_command_t  ngx_http_kv_aware_commands[] = {

    { ngx_string("kv_aware"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_kv_aware,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kv_aware_events"),
      NGX_HTTP_UPS_CONF|NGX_CONF_1MORE,
      ngx_http_kv_aware_events_conf_directive,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kv_aware_tokenize"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_kv_aware_tokenize_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kv_aware_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_kv_aware_status_directive,
      0,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_kv_aware_module_ctx = {
    ngx_http_kv_aware_preconfiguration,    /* preconfiguration */
    ngx_http_kv_aware_postconfiguration,   /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_kv_aware_create_srv_conf,     /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_kv_aware_tokenize_create_conf, /* create location configuration */
    ngx_http_kv_aware_tokenize_merge_conf  /* merge location configuration */
};


ngx_module_t  ngx_http_kv_aware_module = {
    NGX_MODULE_V1,
    &ngx_http_kv_aware_module_ctx,         /* module context */
    ngx_http_kv_aware_commands,            /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_kv_aware_init_process,        /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_kv_aware_subscription_exit_process, /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static void *
ngx_http_kv_aware_create_srv_conf(ngx_conf_t *cf)
{
    static ngx_str_t  name = ngx_string("kv_aware");

    ngx_http_kv_aware_srv_conf_t  *kcf;

    kcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_srv_conf_t));
    if (kcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     kcf->spec_ttl = 0;
     *     kcf->shm_zone = NULL;
     *     kcf->events = NULL;
     *     kcf->peer_names = NULL;
     *     kcf->scratch = NULL;
     */

    if (ngx_http_kv_aware_conf_defaults(cf, &name, ngx_http_kv_aware_params,
                                        kcf)
        != NGX_CONF_OK)
    {
        return NULL;
    }

    return kcf;
}


static ngx_int_t
ngx_http_kv_aware_preconfiguration(ngx_conf_t *cf)
{
    return ngx_http_kv_aware_variables_add(cf);
}


static char *
ngx_http_kv_aware(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_kv_aware_srv_conf_t *kcf = conf;

    u_char                        *p;
    size_t                         size;
    ngx_str_t                      name;
    ngx_http_upstream_srv_conf_t  *uscf;

    if (kcf->shm_zone) {
        return "is duplicate";
    }

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (uscf->peer.init_upstream) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "load balancing method redefined");
    }

    if (ngx_http_kv_aware_conf_params(cf, ngx_http_kv_aware_params, kcf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    kcf->upstream = uscf->host;

    name.len = sizeof("kv_aware:") - 1 + uscf->host.len;
    name.data = ngx_pnalloc(cf->pool, name.len);
    if (name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    p = ngx_cpymem(name.data, "kv_aware:", sizeof("kv_aware:") - 1);
    ngx_memcpy(p, uscf->host.data, uscf->host.len);

    /*
     * The per-slot tables (KVA_MAX_SLOTS of them, 0.5 MB at 1,024 slots)
     * come on top of index_size: it stays what the blocks get.
     */
    size = kcf->index_size + sizeof(ngx_http_kv_aware_shctx_t)
           + sizeof(kva_index_t) + ngx_http_kv_aware_share_size()
           + ngx_http_kv_aware_session_size(kcf);

    kcf->shm_zone = ngx_shared_memory_add(cf, &name, size,
                                          &ngx_http_kv_aware_module);
    if (kcf->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (kcf->shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "kv_aware: duplicate upstream \"%V\"", &uscf->host);
        return NGX_CONF_ERROR;
    }

    kcf->shm_zone->init = ngx_http_kv_aware_zone_init;
    kcf->shm_zone->data = kcf;

    uscf->peer.init_upstream = ngx_http_kv_aware_balancer_init_upstream;

    uscf->flags = NGX_HTTP_UPSTREAM_CREATE
                  |NGX_HTTP_UPSTREAM_WEIGHT
                  |NGX_HTTP_UPSTREAM_MAX_CONNS
                  |NGX_HTTP_UPSTREAM_MAX_FAILS
                  |NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
                  |NGX_HTTP_UPSTREAM_DOWN
#if (NGX_HTTP_KV_AWARE_RESOLVE)
                  |NGX_HTTP_UPSTREAM_MODIFY
#endif
                  |NGX_HTTP_UPSTREAM_BACKUP;

    return NGX_CONF_OK;
}


static char *
ngx_http_kv_aware_conf_keys(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_uint_t  *kp;

    kp = (ngx_uint_t *) ((u_char *) conf + p->offset);

    if (value->len == 4 && ngx_strncmp(value->data, "text", 4) == 0) {
        *kp = NGX_HTTP_KV_AWARE_KEYS_TEXT;
        return NGX_CONF_OK;
    }

    if (value->len == 6 && ngx_strncmp(value->data, "tokens", 6) == 0) {
        *kp = NGX_HTTP_KV_AWARE_KEYS_TOKENS;
        return NGX_CONF_OK;
    }

    return "text or tokens";
}



/* a worker's own: its scratch arrays first, then the subscriber */
static ngx_int_t
ngx_http_kv_aware_init_process(ngx_cycle_t *cycle)
{
    if (ngx_http_kv_aware_scratch_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_kv_aware_subscription_init_process(cycle);
}


static ngx_int_t
ngx_http_kv_aware_postconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_kv_aware_tokenize_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_kv_aware_ttft_init(cf);
}

ngx_http_kv_aware_ctx_t *
ngx_http_kv_aware_module_request_ctx(ngx_http_request_t *r)
{
    ngx_http_kv_aware_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_kv_aware_module);

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_kv_aware_ctx_t));
        if (ctx == NULL) {
            return NULL;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_kv_aware_module);
    }

    return ctx;
}


ngx_uint_t
ngx_http_kv_aware_module_rc_reason(const ngx_http_kv_aware_rc_map_t *map,
    ngx_uint_t n, ngx_uint_t rc, ngx_uint_t dflt)
{
    ngx_uint_t  i;

    for (i = 0; i < n; i++) {
        if (map[i].rc == rc) {
            return map[i].reason;
        }
    }

    return dflt;
}
