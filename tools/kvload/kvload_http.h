/*
 * kvload HTTP/1.1 client on libevent bufferevents: keepalive pool per
 * target, Content-Length / chunked / until-close bodies, and SSE "data:"
 * lines handed to a callback as they arrive.
 */

#ifndef _KVLOAD_HTTP_H_INCLUDED_
#define _KVLOAD_HTTP_H_INCLUDED_


#include <stddef.h>

#include <netinet/in.h>
#include <event2/event.h>
#include <event2/buffer.h>


#define KVL_HTTP_BODY_MAX   (1024 * 1024)


typedef enum {
    KVL_HTTP_OK = 0,
    KVL_HTTP_ECONNECT,
    KVL_HTTP_ERESET,
    KVL_HTTP_ETIMEOUT,
    KVL_HTTP_EPROTO,
    KVL_HTTP_ENOMEM
} kvl_http_err_e;


typedef struct kvl_conn_s      kvl_conn_t;
typedef struct kvl_http_req_s  kvl_http_req_t;

typedef void (*kvl_http_event_pt)(kvl_http_req_t *r, const char *data,
    size_t len, double now);
typedef void (*kvl_http_done_pt)(kvl_http_req_t *r);


typedef struct {
    struct event_base  *base;
    struct sockaddr_in  sin;
    char                host[64];       /* "ip:port", for Host: */
    kvl_conn_t         *idle;
} kvl_target_t;


struct kvl_http_req_s {
    kvl_target_t       *target;
    kvl_http_event_pt   on_event;       /* SSE; NULL: keep body in body */
    kvl_http_done_pt    done;
    void               *data;

    int                 status;
    kvl_http_err_e      error;
    double              t_done;
    char                upstream[48];   /* X-Upstream-Addr, if any */
    struct evbuffer    *body;

    /* private */
    struct evbuffer    *wire;
    struct event       *timer;
    kvl_conn_t         *conn;
    unsigned            retried:1;
};


int kvl_target_init(kvl_target_t *t, struct event_base *base,
    const char *hostport);
void kvl_target_close(kvl_target_t *t);

int kvl_http_send(kvl_http_req_t *r, const char *method, const char *path,
    const char *body, size_t len, double timeout);
const char *kvl_http_strerror(kvl_http_err_e err);

double kvl_now(void);


#endif /* _KVLOAD_HTTP_H_INCLUDED_ */
