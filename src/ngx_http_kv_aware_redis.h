/*
 * ngx_http_kv_aware_module: the Redis link, a subscriber and a publisher
 * on the nginx event loop.  It knows nothing of who consumes it: what it
 * receives goes to the handlers it is given at start.
 */

#ifndef _NGX_HTTP_KV_AWARE_REDIS_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_REDIS_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"


/* the Redis link, as the status page reports it */
#define NGX_HTTP_KV_AWARE_REDIS_STATES(X)                                     \
    X(REDIS_OFF, "off")                                                       \
    X(REDIS_CONNECTING, "connecting")                                         \
    X(REDIS_UP, "up")                                                         \
    X(REDIS_DOWN, "down")

typedef enum {
    NGX_HTTP_KV_AWARE_REDIS_STATES(NGX_HTTP_KV_AWARE_ENUM2)
    NGX_HTTP_KV_AWARE_REDIS_LAST
} ngx_http_kv_aware_redis_state_e;


typedef struct ngx_http_kv_aware_redis_s  ngx_http_kv_aware_redis_t;


/*
 * cluster=on: the nodes redis= names (given more than once, or a name
 * with several addresses), tried in turn until one answers CLUSTER SLOTS
 */
#define NGX_HTTP_KV_AWARE_SEEDS         8


/* where to connect and what to subscribe to, from the configuration */
typedef struct {
    ngx_str_t                       addr_text;    /* for messages */
    u_char                          ip[NGX_SOCKADDR_STRLEN + 1];
    ngx_uint_t                      port;
    ngx_http_kv_aware_redis_addr_t  seeds[NGX_HTTP_KV_AWARE_SEEDS];
    ngx_uint_t                      nseeds;       /* the first: ip, port */
    ngx_uint_t                      nredis;       /* redis= given */
    ngx_uint_t                      seeds_over;   /* past SEEDS */
    ngx_str_t                       channel;      /* NUL-terminated */
    ngx_flag_t                      pattern;
    ngx_flag_t                      cluster;      /* sharded, on a cluster */
    ngx_uint_t                      slot;         /* the channel's */
    ngx_str_t                       second;       /* also; len 0: none */
    ngx_str_t                       user;
    ngx_str_t                       password;
    ngx_msec_t                      connect_timeout;
    ngx_msec_t                      read_timeout;
    ngx_str_t                       name;         /* the consumer's */
} ngx_http_kv_aware_redis_conf_t;


/* what the link reports, in shared memory for the status page */
typedef struct {
    ngx_uint_t                      state;
    ngx_atomic_t                    connects;
    ngx_atomic_t                    failures;
} ngx_http_kv_aware_redis_stats_t;


typedef void (*ngx_http_kv_aware_redis_message_pt)(void *data, u_char *msg,
    size_t len);
typedef void (*ngx_http_kv_aware_redis_event_pt)(void *data);


/*
 * message: a message on the channel, once subscribed.
 * second: a message on the second channel (conf->second).
 * subscribed: the subscription is (again) in place.
 * lost: the subscription is gone; the link reconnects by itself.
 * closing: graceful shutdown asks the link to go; the consumer may keep it
 * for a while or stop it at once with ngx_http_kv_aware_redis_stop().
 */
typedef struct {
    ngx_http_kv_aware_redis_message_pt   message;
    ngx_http_kv_aware_redis_message_pt   second;
    ngx_http_kv_aware_redis_event_pt     subscribed;
    ngx_http_kv_aware_redis_event_pt     lost;
    ngx_http_kv_aware_redis_event_pt     closing;
    void                                *data;
} ngx_http_kv_aware_redis_handlers_t;


extern const char  *ngx_http_kv_aware_redis_state_names[];


ngx_http_kv_aware_redis_t *ngx_http_kv_aware_redis_start(ngx_cycle_t *cycle,
    ngx_http_kv_aware_redis_conf_t *conf,
    ngx_http_kv_aware_redis_stats_t *stats,
    ngx_http_kv_aware_redis_handlers_t *handlers);
void ngx_http_kv_aware_redis_stop(ngx_http_kv_aware_redis_t *rd);
ngx_int_t ngx_http_kv_aware_redis_publish(ngx_http_kv_aware_redis_t *rd,
    ngx_str_t *channel, u_char *data, size_t len);


#endif /* _NGX_HTTP_KV_AWARE_REDIS_H_INCLUDED_ */
