/*
 * kvload HTTP client: libevent's evhttp with a pool of kept-alive
 * connections per target, and SSE "data:" lines handed to a callback as
 * they arrive.
 */

#ifndef _KVLOAD_HTTP_H_INCLUDED_
#define _KVLOAD_HTTP_H_INCLUDED_


#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/http.h>


#define KVL_HTTP_BODY_MAX   (1024 * 1024)


/* error: 0, or 1 + evhttp's enum evhttp_request_error */
#define KVL_HTTP_ETIMEOUT   (1 + EVREQ_HTTP_TIMEOUT)


typedef struct kvl_http_req_s  kvl_http_req_t;

typedef void (*kvl_http_event_pt)(kvl_http_req_t *r, const char *data,
    size_t len, double now);
typedef void (*kvl_http_done_pt)(kvl_http_req_t *r);


typedef struct {
    struct event_base          *base;
    char                        ip[48];
    unsigned short              port;
    char                        host[64];   /* for Host: */
    struct evhttp_connection  **idle;
    size_t                      nidle;
    size_t                      nconns;
    size_t                      max_conns;
} kvl_target_t;


struct kvl_http_req_s {
    kvl_target_t               *target;
    kvl_http_event_pt           on_event;   /* SSE; NULL: body kept */
    kvl_http_done_pt            done;
    void                       *data;
    const char                 *hname;  /* one more header, or NULL */
    const char                 *hvalue;

    int                         status;
    int                         error;
    double                      t_done;
    char                        upstream[48];   /* X-Upstream-Addr */
    char                        server[48];     /* X-Kvsim-Server */
    struct evbuffer            *buf;    /* the body, or SSE partial lines */
    struct evhttp_connection   *conn;

    /*
     * A request sent on a kept-alive connection that the server closed
     * meanwhile (nginx does on reload) gets no answer at all: sent again
     * once on a new connection, as HTTP clients do.
     */
    struct evbuffer            *again;  /* the body, while it may be */
    const char                 *path;
    double                      timeout;
    unsigned                    reused:1;
    unsigned                    retries;
};


int kvl_target_init(kvl_target_t *t, struct event_base *base,
    const char *hostport, size_t max_conns);

int kvl_http_send(kvl_http_req_t *r, const char *path, const char *body,
    size_t len, double timeout);
const char *kvl_http_strerror(int err);

double kvl_now(void);


#endif /* _KVLOAD_HTTP_H_INCLUDED_ */
