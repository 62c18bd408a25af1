/*
 * ngx_http_kv_aware_module: the kv_aware_events directive.
 */

#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_conf.h"
#include "ngx_http_kv_aware_events.h"
#include "kva_cluster.h"


#define ngx_http_kv_aware_events_offset(field)                                \
    offsetof(ngx_http_kv_aware_events_conf_t, field)


static char *ngx_http_kv_aware_events_redis(ngx_conf_t *cf,
    ngx_http_kv_aware_param_t *p, ngx_str_t *value, void *conf);
static char *ngx_http_kv_aware_events_cluster(
    ngx_http_kv_aware_events_conf_t *ecf);


/* see docs/reference.md, "kv_aware_events" */
static ngx_http_kv_aware_param_t  ngx_http_kv_aware_events_params[] = {

    { ngx_string("redis"),
      ngx_http_kv_aware_events_redis,
      0, 0, 0, NULL },

    { ngx_string("channel"),
      ngx_http_kv_aware_conf_str,
      ngx_http_kv_aware_events_offset(link.channel),
      0, 0, "kv_aware:events" },

    { ngx_string("pattern"),
      ngx_http_kv_aware_conf_flag,
      ngx_http_kv_aware_events_offset(link.pattern),
      0, 0, "off" },

    /* a Redis Cluster: sharded pub/sub on the channel slot's master */
    { ngx_string("cluster"),
      ngx_http_kv_aware_conf_flag,
      ngx_http_kv_aware_events_offset(link.cluster),
      0, 0, "off" },

    /* the default, CHANNEL:resync, is made once the channel is known */
    { ngx_string("resync_channel"),
      ngx_http_kv_aware_conf_str,
      ngx_http_kv_aware_events_offset(resync_channel),
      0, 0, NULL },

    { ngx_string("user"),
      ngx_http_kv_aware_conf_str,
      ngx_http_kv_aware_events_offset(link.user),
      0, 0, NULL },

    { ngx_string("password"),
      ngx_http_kv_aware_conf_str,
      ngx_http_kv_aware_events_offset(link.password),
      0, 0, NULL },

    { ngx_string("connect_timeout"),
      ngx_http_kv_aware_conf_msec,
      ngx_http_kv_aware_events_offset(link.connect_timeout),
      10, 86400 * 1000, "2s" },

    { ngx_string("read_timeout"),
      ngx_http_kv_aware_conf_msec,
      ngx_http_kv_aware_events_offset(link.read_timeout),
      10, 86400 * 1000, "5s" },

    { ngx_string("heartbeat"),
      ngx_http_kv_aware_conf_msec,
      ngx_http_kv_aware_events_offset(heartbeat),
      10, 86400 * 1000, "10s" },

    { ngx_string("speculative_ttl"),
      ngx_http_kv_aware_conf_msec,
      ngx_http_kv_aware_events_offset(spec_ttl),
      10, 86400 * 1000, "10s" },

    /*
     * Twice a busy engine step: 16k batched tokens are 1,024 blocks of 16
     * stored and as many removed, one event a sequence of at most 1,024.
     * The largest message they allow decodes in about 3 ms.
     */
    { ngx_string("max_message"),
      ngx_http_kv_aware_conf_size,
      ngx_http_kv_aware_events_offset(max_message),
      256, NGX_HTTP_KV_AWARE_NO_MAX, "512k" },

    { ngx_string("max_hashes"),
      ngx_http_kv_aware_conf_uint,
      ngx_http_kv_aware_events_offset(max_hashes),
      1, NGX_HTTP_KV_AWARE_NO_MAX, "8192" },

    { ngx_string("max_events"),
      ngx_http_kv_aware_conf_uint,
      ngx_http_kv_aware_events_offset(max_events),
      1, NGX_HTTP_KV_AWARE_NO_MAX, "1024" },

    { ngx_string("max_rate"),
      ngx_http_kv_aware_conf_uint,
      ngx_http_kv_aware_events_offset(budget.max_rate),
      1, NGX_HTTP_KV_AWARE_NO_MAX, "20000" },

    { ngx_string("server_bytes"),
      ngx_http_kv_aware_conf_size,
      ngx_http_kv_aware_events_offset(budget.server_bytes),
      1024, NGX_HTTP_KV_AWARE_NO_MAX, "8m" },

    { ngx_string("server_hashes"),
      ngx_http_kv_aware_conf_uint,
      ngx_http_kv_aware_events_offset(budget.server_hashes),
      1, NGX_HTTP_KV_AWARE_NO_MAX, "1000000" },

    /* what this nginx routes, to the others on CHANNEL:learned */
    { ngx_string("share"),
      ngx_http_kv_aware_conf_flag,
      ngx_http_kv_aware_events_offset(share),
      0, 0, "off" },

    ngx_http_kv_aware_null_param
};


char *
ngx_http_kv_aware_events_conf_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_kv_aware_srv_conf_t *kcf = conf;

    u_char                           *p;
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

    if (ngx_http_kv_aware_conf_defaults(cf, &cmd->name,
                                        ngx_http_kv_aware_events_params, ecf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_kv_aware_conf_params(cf, ngx_http_kv_aware_events_params,
                                      ecf)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ecf->link.port == 0) {
        return "needs redis=address[:port]";
    }

    if (!ecf->link.cluster) {
        if (ecf->link.nredis > 1) {
            return "has redis= more than once: several seeds are for "
                   "cluster=on";
        }

        ecf->link.nseeds = 1;

    } else if (ecf->link.seeds_over) {
        return "has more than 8 addresses in redis= (cluster seeds)";
    }

    if (ecf->link.user.len && ecf->link.password.len == 0) {
        return "has user= without password=";
    }

    /* a budget a single message can exceed would refuse it every time */
    if (ecf->budget.server_bytes < ecf->max_message) {
        return "has server_bytes= below max_message=";
    }

    if (ecf->budget.server_hashes < ecf->max_hashes) {
        return "has server_hashes= below max_hashes=";
    }

    if (ecf->resync_channel.len == 0) {
        if (ecf->link.pattern) {
            return "needs resync_channel= with pattern=on";
        }

        ecf->resync_channel.len = ecf->link.channel.len
                                  + sizeof(":resync") - 1;
        ecf->resync_channel.data = ngx_pnalloc(cf->pool,
                                               ecf->resync_channel.len);
        if (ecf->resync_channel.data == NULL) {
            return NGX_CONF_ERROR;
        }

        p = ngx_cpymem(ecf->resync_channel.data, ecf->link.channel.data,
                       ecf->link.channel.len);
        ngx_memcpy(p, ":resync", sizeof(":resync") - 1);
    }

    if (ecf->share) {
        if (ecf->link.pattern) {
            return "needs pattern=off with share=on";
        }

        ecf->link.second.len = ecf->link.channel.len
                               + sizeof(":learned") - 1;
        ecf->link.second.data = ngx_pnalloc(cf->pool,
                                            ecf->link.second.len + 1);
        if (ecf->link.second.data == NULL) {
            return NGX_CONF_ERROR;
        }

        p = ngx_cpymem(ecf->link.second.data, ecf->link.channel.data,
                       ecf->link.channel.len);
        ngx_memcpy(p, ":learned", sizeof(":learned"));
    }

    if (ecf->link.cluster) {
        p = (u_char *) ngx_http_kv_aware_events_cluster(ecf);
        if (p != NULL) {
            return (char *) p;
        }
    }

    ecf->link.name = kcf->upstream;

    /* the index clock reads it on every request: no detour through ecf */
    kcf->spec_ttl = ecf->spec_ttl;
    kcf->events = ecf;

    return NGX_CONF_OK;
}


/*
 * The channels a subscriber and its publisher use (CHANNEL, its resync,
 * learned and ping channels) must be on one node: one slot.  A hash tag
 * in CHANNEL puts every name it starts in its slot.
 */
static char *
ngx_http_kv_aware_events_cluster(ngx_http_kv_aware_events_conf_t *ecf)
{
    ngx_str_t  *ch;

    ch = &ecf->link.channel;

    if (ecf->link.pattern) {
        return "needs pattern=off with cluster=on (no sharded PSUBSCRIBE)";
    }

    if (!kva_cluster_has_tag(ch->data, ch->len)) {
        return "needs a channel= with a hash tag with cluster=on, "
               "e.g. channel={kv_aware}:events, so that the channels "
               "made from it share its cluster slot";
    }

    ecf->link.slot = kva_cluster_slot(ch->data, ch->len);

    if (kva_cluster_slot(ecf->resync_channel.data, ecf->resync_channel.len)
        != ecf->link.slot)
    {
        return "has a resync_channel= in another cluster slot than "
               "channel= (give it the same hash tag)";
    }

    return NULL;
}


/*
 * Names are resolved here, at configuration time in the master, so that
 * no worker ever waits for DNS: hiredis only ever sees an IP address.
 */
static char *
ngx_http_kv_aware_events_redis(ngx_conf_t *cf, ngx_http_kv_aware_param_t *p,
    ngx_str_t *value, void *conf)
{
    ngx_http_kv_aware_events_conf_t *ecf = conf;

    u_char                          *last, *q;
    size_t                           len;
    ngx_url_t                        u;
    ngx_uint_t                       i, k;
    ngx_http_kv_aware_redis_addr_t   addr, *seeds;

    seeds = ecf->link.seeds;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = *value;
    u.default_port = 6379;

    if (ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0) {
        if (u.err == NULL) {
            return "an address[:port]";
        }

        q = ngx_pnalloc(cf->pool, NGX_MAX_ERROR_STR);
        if (q == NULL) {
            return NGX_CONF_ERROR;
        }

        last = ngx_slprintf(q, q + NGX_MAX_ERROR_STR - 1,
                            "an address[:port] (%s)", u.err);
        *last = '\0';

        return (char *) q;
    }

    /*
     * Every address is kept as a seed; without cluster=on only the first
     * of a single redis= is used (a name such as localhost may have an
     * IPv4 and an IPv6 address: that was always the first one).
     */
    ecf->link.nredis++;

    /* an address given twice is one seed: only new ones count to 8 */
    for (i = 0; i < u.naddrs; i++) {
        len = ngx_sock_ntop(u.addrs[i].sockaddr, u.addrs[i].socklen,
                            addr.ip, NGX_SOCKADDR_STRLEN, 0);
        addr.ip[len] = '\0';
        addr.port = ngx_inet_get_port(u.addrs[i].sockaddr);

        for (k = 0; k < ecf->link.nseeds; k++) {
            if (seeds[k].port == addr.port
                && ngx_strcmp(seeds[k].ip, addr.ip) == 0)
            {
                break;
            }
        }

        if (k < ecf->link.nseeds) {
            continue;
        }

        if (ecf->link.nseeds == NGX_HTTP_KV_AWARE_SEEDS) {
            ecf->link.seeds_over = 1;
            break;
        }

        seeds[ecf->link.nseeds++] = addr;
    }

    if (ecf->link.port == 0) {
        ngx_memcpy(ecf->link.ip, seeds[0].ip, sizeof(ecf->link.ip));
        ecf->link.port = seeds[0].port;
        ecf->link.addr_text = u.addrs[0].name;
    }

    return NGX_CONF_OK;
}
