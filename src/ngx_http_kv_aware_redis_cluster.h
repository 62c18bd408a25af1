/*
 * ngx_http_kv_aware_module: the Redis link on a Redis Cluster, and the
 * link's connections, which the link (ngx_http_kv_aware_redis.c) and its
 * cluster part (ngx_http_kv_aware_redis_cluster.c) share; no other file
 * includes this one.
 */

#ifndef _NGX_HTTP_KV_AWARE_REDIS_CLUSTER_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_REDIS_CLUSTER_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"
#include "ngx_http_kv_aware_redis_loop.h"


#define NGX_HTTP_KV_AWARE_BACKOFF_MIN   100
#define NGX_HTTP_KV_AWARE_BACKOFF_MAX   3000

/* moves in a row at the shortest backoff; then it grows as for failures */
#define NGX_HTTP_KV_AWARE_MOVES_FREE    2

/* seconds between two logs of a refused SPUBLISH */
#define NGX_HTTP_KV_AWARE_REFUSED_LOG   10

/* the cluster's nodes a link tries when the one it knew is gone */
#define NGX_HTTP_KV_AWARE_CLUSTER_NODES 16


/* cluster=on: what the link knows of the cluster, one per link pair */
typedef struct {
    ngx_uint_t                       slot;      /* the channel's */
    ngx_str_t                       *channel;
    ngx_str_t                       *ping;
    ngx_str_t                       *second;    /* len 0: none */
    ngx_log_t                       *log;

    /* the seeds, then the nodes the last CLUSTER SLOTS named */
    ngx_http_kv_aware_redis_addr_t   nodes[NGX_HTTP_KV_AWARE_CLUSTER_NODES];
    ngx_uint_t                       nnodes;
    ngx_uint_t                       nseeds;
    ngx_uint_t                       next;      /* to try */
} ngx_http_kv_aware_cluster_t;


/* one connection to Redis: the subscriber or the publisher */
typedef struct {
    ngx_http_kv_aware_redis_conn_t   conn;      /* hiredis, on the loop */
    struct ngx_http_kv_aware_redis_s  *redis;
    ngx_http_kv_aware_cluster_t     *cluster;   /* cluster=on */
    ngx_http_kv_aware_redis_addr_t   addr;      /* where it connects */
    ngx_event_t                      retry;     /* reconnect after backoff */
    ngx_event_t                      watch;     /* connect timeout, pings */
    ngx_msec_t                       backoff;
    ngx_uint_t                       moves;     /* in a row, not placed */
    time_t                           refused;   /* an error last logged */
    unsigned                         subscriber:1;
    unsigned                         connected:1;
    unsigned                         ready:1;   /* authenticated, subscribed */
    unsigned                         ping_out:1;
    unsigned                         closing:1; /* we free it: no callbacks */
    unsigned                         moving:1;  /* to addr: not a failure */
} ngx_http_kv_aware_link_t;


/*
 * ngx_http_kv_aware_redis.c: the link is on the node it wants; what the
 * subscriber hears (data: the link).
 */
void ngx_http_kv_aware_link_subscribe(ngx_http_kv_aware_link_t *link);
void ngx_http_kv_aware_link_on_message(redisAsyncContext *ac, void *r,
    void *data);

/*
 * ngx_http_kv_aware_redis_cluster.c, cluster=on: ask the node which one
 * owns the channel's slot (the link goes on with link_subscribe() there);
 * subscribe and publish sharded; choose where to go after a loss.
 */
void ngx_http_kv_aware_cluster_ask(ngx_http_kv_aware_link_t *link);
void ngx_http_kv_aware_cluster_subscribe(ngx_http_kv_aware_link_t *link);
ngx_int_t ngx_http_kv_aware_cluster_publish(ngx_http_kv_aware_link_t *link,
    ngx_str_t *channel, u_char *data, size_t len);
void ngx_http_kv_aware_cluster_moved(ngx_http_kv_aware_link_t *link,
    const char *why, size_t len);
void ngx_http_kv_aware_cluster_lost(ngx_http_kv_aware_link_t *link);


#endif /* _NGX_HTTP_KV_AWARE_REDIS_CLUSTER_H_INCLUDED_ */
