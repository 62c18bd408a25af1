/*
 * ngx_http_kv_aware_module: a hiredis context on nginx's event loop; see
 * the header.
 *
 * hiredis owns each socket: we wrap its fd in an ngx_connection_t for the
 * event loop, hiredis asks for read and write events through the hooks
 * here, and on cleanup we give the connection back without closing the
 * fd, which hiredis does.
 */

#include "ngx_http_kv_aware_redis_loop.h"


static void ngx_http_kv_aware_read_handler(ngx_event_t *ev);
static void ngx_http_kv_aware_write_handler(ngx_event_t *ev);
static void ngx_http_kv_aware_ev_add_read(void *data);
static void ngx_http_kv_aware_ev_del_read(void *data);
static void ngx_http_kv_aware_ev_add_write(void *data);
static void ngx_http_kv_aware_ev_del_write(void *data);
static void ngx_http_kv_aware_ev_cleanup(void *data);


ngx_int_t
ngx_http_kv_aware_redis_loop_attach(ngx_http_kv_aware_redis_conn_t *conn)
{
    ngx_connection_t   *c;
    redisAsyncContext  *ac;

    ac = conn->ac;

    c = ngx_get_connection(ac->c.fd, conn->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->data = conn;
    c->log = conn->log;
    c->read->log = c->log;
    c->write->log = c->log;
    c->read->handler = ngx_http_kv_aware_read_handler;
    c->write->handler = ngx_http_kv_aware_write_handler;

    /* graceful shutdown closes idle connections: let it close ours */
    c->idle = 1;

    conn->c = c;

    ac->ev.data = conn;
    ac->ev.addRead = ngx_http_kv_aware_ev_add_read;
    ac->ev.delRead = ngx_http_kv_aware_ev_del_read;
    ac->ev.addWrite = ngx_http_kv_aware_ev_add_write;
    ac->ev.delWrite = ngx_http_kv_aware_ev_del_write;
    ac->ev.cleanup = ngx_http_kv_aware_ev_cleanup;

    return NGX_OK;
}


static void
ngx_http_kv_aware_read_handler(ngx_event_t *ev)
{
    ngx_connection_t                *c = ev->data;
    ngx_http_kv_aware_redis_conn_t  *conn = c->data;

    /* graceful shutdown: the owner keeps the connection or lets it go */
    if (c->close && conn->closing(conn->data) == NGX_DONE) {
        return;
    }

    if (conn->ac) {
        redisAsyncHandleRead(conn->ac);
    }
}


static void
ngx_http_kv_aware_write_handler(ngx_event_t *ev)
{
    ngx_connection_t                *c = ev->data;
    ngx_http_kv_aware_redis_conn_t  *conn = c->data;

    if (conn->ac) {
        redisAsyncHandleWrite(conn->ac);
    }
}


static void
ngx_http_kv_aware_ev_add_read(void *data)
{
    ngx_http_kv_aware_redis_conn_t  *conn = data;

    /* level-triggered: hiredis reads once per call, not until EAGAIN */
    if (!conn->c->read->active) {
        (void) ngx_add_event(conn->c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_kv_aware_ev_del_read(void *data)
{
    ngx_http_kv_aware_redis_conn_t  *conn = data;

    if (conn->c->read->active) {
        (void) ngx_del_event(conn->c->read, NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_kv_aware_ev_add_write(void *data)
{
    ngx_http_kv_aware_redis_conn_t  *conn = data;

    if (!conn->c->write->active) {
        (void) ngx_add_event(conn->c->write, NGX_WRITE_EVENT,
                             NGX_LEVEL_EVENT);
    }
}


static void
ngx_http_kv_aware_ev_del_write(void *data)
{
    ngx_http_kv_aware_redis_conn_t  *conn = data;

    if (conn->c->write->active) {
        (void) ngx_del_event(conn->c->write, NGX_WRITE_EVENT, 0);
    }
}


/* hiredis is freeing the context and will close the fd itself */
static void
ngx_http_kv_aware_ev_cleanup(void *data)
{
    ngx_http_kv_aware_redis_conn_t  *conn = data;

    ngx_connection_t  *c;

    c = conn->c;

    if (c == NULL) {
        return;
    }

    conn->c = NULL;

    if (c->read->active) {
        (void) ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }

    if (c->write->active) {
        (void) ngx_del_event(c->write, NGX_WRITE_EVENT, 0);
    }

    c->fd = (ngx_socket_t) -1;
    ngx_free_connection(c);
}
