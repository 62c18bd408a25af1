/*
 * kvsim: a completion request, from its body, read as the module reads it,
 * to the sequence it becomes in the server's scheduler.
 */

#ifndef _KVSIM_REQUEST_H_INCLUDED_
#define _KVSIM_REQUEST_H_INCLUDED_


#include <time.h>

#include <event2/event.h>
#include <event2/http.h>

#include "kvsim.h"


typedef struct kvs_conn_s  kvs_conn_t;     /* kvsim_http.c */


typedef struct {
    kvs_server_t               *srv;
    kvs_conn_t                 *conn;
    struct evhttp_request      *req;    /* NULL: the client is gone */
    kvs_seq_t                  *seq;
    struct event               *watch;  /* the client closing */
    uint64_t                    id;
    time_t                      created;
    unsigned                    chat:1;
    unsigned                    stream:1;
    unsigned                    started:1;
    char                        model[];    /* JSON-escaped */
} kvs_req_t;


/* NULL: the client has been answered with an error */
kvs_req_t *kvs_request_create(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat);


#endif /* _KVSIM_REQUEST_H_INCLUDED_ */
