/*
 * ngx_http_kv_aware_module: a hiredis async context on nginx's event
 * loop, the way Nchan's adapter puts it there.  It knows nothing of what
 * is said on the connection; the Redis link (ngx_http_kv_aware_redis.c,
 * its cluster part ngx_http_kv_aware_redis_cluster.c) and this file are
 * the only ones that include hiredis.
 */

#ifndef _NGX_HTTP_KV_AWARE_REDIS_LOOP_H_INCLUDED_
#define _NGX_HTTP_KV_AWARE_REDIS_LOOP_H_INCLUDED_


#include "ngx_http_kv_aware_common.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>


/*
 * closing: graceful shutdown closes idle connections, this one too; the
 * owner says NGX_DONE if it stopped the connection meanwhile.
 */
typedef ngx_int_t (*ngx_http_kv_aware_redis_closing_pt)(void *data);

typedef struct {
    redisAsyncContext                   *ac;
    ngx_connection_t                    *c;       /* around ac's fd */
    ngx_log_t                           *log;
    ngx_http_kv_aware_redis_closing_pt   closing;
    void                                *data;
} ngx_http_kv_aware_redis_conn_t;


/* conn->ac is connecting: its fd goes on the event loop */
ngx_int_t ngx_http_kv_aware_redis_loop_attach(
    ngx_http_kv_aware_redis_conn_t *conn);


#endif /* _NGX_HTTP_KV_AWARE_REDIS_LOOP_H_INCLUDED_ */
