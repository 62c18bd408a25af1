/*
 * ngx_http_kv_aware_module: the Redis link's insides, shared by its two
 * files (the link, and hiredis on nginx's event loop) and included by
 * nothing else: with them, the only files that see hiredis.
 */

#ifndef _NGX_HTTP_KV_AWARE_REDIS_LINK_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_REDIS_LINK_H_INCLUDED_


#include "ngx_http_kv_aware_redis.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>


/* one connection to Redis: the subscriber or the publisher */
typedef struct {
    ngx_http_kv_aware_redis_t     *redis;
    redisAsyncContext             *ac;
    ngx_connection_t              *c;
    ngx_event_t                    retry;     /* reconnect after backoff */
    ngx_event_t                    watch;     /* connect timeout, pings */
    ngx_msec_t                     backoff;
    unsigned                       subscriber:1;
    unsigned                       connected:1;
    unsigned                       ready:1;   /* authenticated, subscribed */
    unsigned                       ping_out:1;
    unsigned                       closing:1; /* we free it: no callbacks */
} ngx_http_kv_aware_link_t;


struct ngx_http_kv_aware_redis_s {
    ngx_http_kv_aware_redis_conf_t      *conf;
    ngx_http_kv_aware_redis_stats_t     *stats;
    ngx_http_kv_aware_redis_handlers_t   handlers;
    ngx_log_t                           *log;
    ngx_http_kv_aware_link_t             sub;
    ngx_http_kv_aware_link_t             pub;
    ngx_str_t                            ping_channel;   /* NUL-terminated */
    unsigned                             stopping:1;
};


/*
 * ngx_http_kv_aware_redis_loop.c: the link's hiredis context on nginx's
 * event loop, its fd in an ngx_connection_t
 */
ngx_int_t ngx_http_kv_aware_redis_attach(ngx_http_kv_aware_link_t *link);


#endif /* _NGX_HTTP_KV_AWARE_REDIS_LINK_H_INCLUDED_ */
