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
static char *ngx_http_kv_aware_events_parse(ngx_conf_t *cf,
    ngx_http_kv_aware_events_conf_t *ecf, ngx_str_t *name, ngx_str_t *v);
static char *ngx_http_kv_aware_redis_addr(ngx_conf_t *cf,
    ngx_http_kv_aware_events_conf_t *ecf, ngx_str_t *v);
static ngx_int_t ngx_http_kv_aware_init_process(ngx_cycle_t *cycle);
static void ngx_http_kv_aware_exit_process(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_kv_aware_each_events(ngx_cycle_t *cycle,
    ngx_int_t (*handler)(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf));
static ngx_int_t ngx_http_kv_aware_stop_events(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf);


static ngx_command_t  ngx_http_kv_aware_commands[] = {

    { ngx_string("kv_aware"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_kv_aware,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kv_aware_events"),
      NGX_HTTP_UPS_CONF|NGX_CONF_1MORE,
      ngx_http_kv_aware_events_directive,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("kv_aware_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_kv_aware_status_directive,
      0,
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
    ngx_http_kv_aware_init_process,        /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_kv_aware_exit_process,        /* exit process */
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
    kcf->score.overlap_weight = 16.0;
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


char *
ngx_http_kv_aware_events_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kv_aware_srv_conf_t *kcf = conf;

    u_char                           *eq, *p;
    ngx_str_t                        *value, name, v;
    ngx_uint_t                        i;
    ngx_http_kv_aware_events_conf_t  *ecf;

    if (kcf->shm_zone == NULL) {
        return "needs \"kv_aware\" before it in the upstream";
    }

    if (kcf->events) {
        return "is duplicate";
    }

    ecf = ngx_pcalloc(cf->pool, sizeof(ngx_http_kv_aware_events_conf_t));
    if (ecf == NULL) {
        return NGX_CONF_ERROR;
    }

    /* defaults: see README, "kv_aware_events" */
    ngx_str_set(&ecf->channel, "kv_aware:events");
    ecf->connect_timeout = 2000;
    ecf->read_timeout = 5000;
    ecf->heartbeat = 10000;
    ecf->spec_ttl = 10000;
    /*
     * Twice a busy engine step: 16k batched tokens are 1,024 blocks of 16
     * stored and as many removed, one event a sequence of at most 1,024.
     * The largest message they allow decodes in about 3 ms.
     */
    ecf->max_message = 512 * 1024;
    ecf->max_hashes = 8192;
    ecf->max_events = 1024;
    ecf->max_rate = 20000;
    ecf->server_bytes = 8 * 1024 * 1024;
    ecf->server_hashes = 1000000;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        eq = ngx_strlchr(value[i].data, value[i].data + value[i].len, '=');

        if (eq == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "kv_aware_events: invalid parameter \"%V\", "
                               "expected name=value", &value[i]);
            return NGX_CONF_ERROR;
        }

        name.data = value[i].data;
        name.len = eq - value[i].data;
        v.data = eq + 1;
        v.len = value[i].data + value[i].len - v.data;

        if (ngx_http_kv_aware_events_parse(cf, ecf, &name, &v)
            != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    if (ecf->port == 0) {
        return "needs redis=address[:port]";
    }

    if (ecf->user.len && ecf->password.len == 0) {
        return "has user= without password=";
    }

    /* a budget a single message can exceed would refuse it every time */
    if (ecf->server_bytes < ecf->max_message) {
        return "has server_bytes= below max_message=";
    }

    if (ecf->server_hashes < ecf->max_hashes) {
        return "has server_hashes= below max_hashes=";
    }

    if (ecf->resync_channel.len == 0) {
        if (ecf->pattern) {
            return "needs resync_channel= with pattern=on";
        }

        ecf->resync_channel.len = ecf->channel.len + sizeof(":resync") - 1;
        ecf->resync_channel.data = ngx_pnalloc(cf->pool,
                                               ecf->resync_channel.len);
        if (ecf->resync_channel.data == NULL) {
            return NGX_CONF_ERROR;
        }

        p = ngx_cpymem(ecf->resync_channel.data, ecf->channel.data,
                       ecf->channel.len);
        ngx_memcpy(p, ":resync", sizeof(":resync") - 1);
    }

    kcf->events = ecf;

    return NGX_CONF_OK;
}


static char *
ngx_http_kv_aware_events_parse(ngx_conf_t *cf,
    ngx_http_kv_aware_events_conf_t *ecf, ngx_str_t *name, ngx_str_t *v)
{
    size_t       size;
    ngx_int_t    n;
    ngx_msec_t  *ms;

    if (name->len == 5 && ngx_strncmp(name->data, "redis", 5) == 0) {
        return ngx_http_kv_aware_redis_addr(cf, ecf, v);
    }

    if (v->len == 0) {
        goto invalid;
    }

    if (name->len == 7 && ngx_strncmp(name->data, "channel", 7) == 0) {
        ecf->channel = *v;
        return NGX_CONF_OK;
    }

    if (name->len == 14 && ngx_strncmp(name->data, "resync_channel", 14) == 0)
    {
        ecf->resync_channel = *v;
        return NGX_CONF_OK;
    }

    if (name->len == 4 && ngx_strncmp(name->data, "user", 4) == 0) {
        ecf->user = *v;
        return NGX_CONF_OK;
    }

    if (name->len == 8 && ngx_strncmp(name->data, "password", 8) == 0) {
        ecf->password = *v;
        return NGX_CONF_OK;
    }

    if (name->len == 7 && ngx_strncmp(name->data, "pattern", 7) == 0) {
        if (v->len == 2 && ngx_strncmp(v->data, "on", 2) == 0) {
            ecf->pattern = 1;
            return NGX_CONF_OK;
        }

        if (v->len == 3 && ngx_strncmp(v->data, "off", 3) == 0) {
            ecf->pattern = 0;
            return NGX_CONF_OK;
        }

        goto invalid;
    }

    ms = NULL;

    if (name->len == 15 && ngx_strncmp(name->data, "connect_timeout", 15) == 0)
    {
        ms = &ecf->connect_timeout;

    } else if (name->len == 12
               && ngx_strncmp(name->data, "read_timeout", 12) == 0)
    {
        ms = &ecf->read_timeout;

    } else if (name->len == 9 && ngx_strncmp(name->data, "heartbeat", 9) == 0)
    {
        ms = &ecf->heartbeat;

    } else if (name->len == 15
               && ngx_strncmp(name->data, "speculative_ttl", 15) == 0)
    {
        ms = &ecf->spec_ttl;
    }

    if (ms) {
        n = ngx_parse_time(v, 0);

        if (n == NGX_ERROR || n < 10 || n > 86400 * 1000) {
            goto invalid;
        }

        *ms = (ngx_msec_t) n;
        return NGX_CONF_OK;
    }

    if (name->len == 11 && ngx_strncmp(name->data, "max_message", 11) == 0) {
        size = ngx_parse_size(v);

        if (size == (size_t) NGX_ERROR || size < 256) {
            goto invalid;
        }

        ecf->max_message = size;
        return NGX_CONF_OK;
    }

    if (name->len == 10 && ngx_strncmp(name->data, "max_hashes", 10) == 0) {
        n = ngx_atoi(v->data, v->len);

        if (n == NGX_ERROR || n < 1) {
            goto invalid;
        }

        ecf->max_hashes = n;
        return NGX_CONF_OK;
    }

    if (name->len == 10 && ngx_strncmp(name->data, "max_events", 10) == 0) {
        n = ngx_atoi(v->data, v->len);

        if (n == NGX_ERROR || n < 1) {
            goto invalid;
        }

        ecf->max_events = n;
        return NGX_CONF_OK;
    }

    if (name->len == 8 && ngx_strncmp(name->data, "max_rate", 8) == 0) {
        n = ngx_atoi(v->data, v->len);

        if (n == NGX_ERROR || n < 1) {
            goto invalid;
        }

        ecf->max_rate = n;
        return NGX_CONF_OK;
    }

    if (name->len == 12 && ngx_strncmp(name->data, "server_bytes", 12) == 0)
    {
        size = ngx_parse_size(v);

        if (size == (size_t) NGX_ERROR || size < 1024) {
            goto invalid;
        }

        ecf->server_bytes = size;
        return NGX_CONF_OK;
    }

    if (name->len == 13 && ngx_strncmp(name->data, "server_hashes", 13) == 0)
    {
        n = ngx_atoi(v->data, v->len);

        if (n == NGX_ERROR || n < 1) {
            goto invalid;
        }

        ecf->server_hashes = n;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "kv_aware_events: invalid parameter \"%V\"", name);
    return NGX_CONF_ERROR;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "kv_aware_events: invalid %V \"%V\"", name, v);
    return NGX_CONF_ERROR;
}


/*
 * Names are resolved here, at configuration time in the master, so that
 * no worker ever waits for DNS: hiredis only ever sees an IP address.
 */
static char *
ngx_http_kv_aware_redis_addr(ngx_conf_t *cf,
    ngx_http_kv_aware_events_conf_t *ecf, ngx_str_t *v)
{
    size_t     len;
    ngx_url_t  u;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *v;
    u.default_port = 6379;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "kv_aware_events: invalid redis \"%V\"%s%s", v,
                           u.err ? ": " : "", u.err ? u.err : "");
        return NGX_CONF_ERROR;
    }

    len = ngx_sock_ntop(u.addrs[0].sockaddr, u.addrs[0].socklen, ecf->ip,
                        NGX_SOCKADDR_STRLEN, 0);
    ecf->ip[len] = '\0';
    ecf->port = ngx_inet_get_port(u.addrs[0].sockaddr);
    ecf->addr_text = u.addrs[0].name;

    return NGX_CONF_OK;
}


/* one subscriber per nginx instance: the first worker holds it */
static ngx_int_t
ngx_http_kv_aware_init_process(ngx_cycle_t *cycle)
{
    if ((ngx_process != NGX_PROCESS_WORKER
         && ngx_process != NGX_PROCESS_SINGLE)
        || ngx_worker != 0)
    {
        return NGX_OK;
    }

    return ngx_http_kv_aware_each_events(cycle,
                                         ngx_http_kv_aware_events_start);
}


static void
ngx_http_kv_aware_exit_process(ngx_cycle_t *cycle)
{
    (void) ngx_http_kv_aware_each_events(cycle,
                                         ngx_http_kv_aware_stop_events);
}


static ngx_int_t
ngx_http_kv_aware_stop_events(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf)
{
    ngx_http_kv_aware_redis_stop(kcf);
    return NGX_OK;
}


static ngx_int_t
ngx_http_kv_aware_each_events(ngx_cycle_t *cycle,
    ngx_int_t (*handler)(ngx_cycle_t *cycle,
    ngx_http_kv_aware_srv_conf_t *kcf))
{
    ngx_uint_t                      i;
    ngx_http_kv_aware_srv_conf_t   *kcf;
    ngx_http_upstream_srv_conf_t  **uscfp;
    ngx_http_upstream_main_conf_t  *umcf;

    umcf = ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_upstream_module);
    if (umcf == NULL) {
        return NGX_OK;
    }

    uscfp = umcf->upstreams.elts;

    for (i = 0; i < umcf->upstreams.nelts; i++) {
        if (uscfp[i]->srv_conf == NULL) {
            continue;
        }

        kcf = ngx_http_conf_upstream_srv_conf(uscfp[i],
                                              ngx_http_kv_aware_module);

        if (kcf->events && kcf->sh && handler(cycle, kcf) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}
