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
#include "kvsim_pd.h"


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
    unsigned                    pending:1;  /* not submitted: pulling */
    unsigned                    hold:1;     /* leg 1: hold its blocks */
    kvs_pd_params_t            *pd;     /* NULL: plain aggregated */
    kvs_pull_t                 *pull;   /* the decode's legs */
    char                        model[];    /* JSON-escaped */
} kvs_req_t;


/* NULL: the client has been answered with an error */
kvs_req_t *kvs_request_create(kvs_server_t *srv, kvs_conn_t *conn,
    struct evhttp_request *req, int chat);
/* a pending request into the scheduler; -1: answered with an error, freed */
int kvs_request_submit(kvs_req_t *r);


#endif /* _KVSIM_REQUEST_H_INCLUDED_ */
