/*
 * kvsim: the OpenAI-compatible HTTP side of one server (evhttp).
 */

#ifndef _KVSIM_HTTP_H_INCLUDED_
#define _KVSIM_HTTP_H_INCLUDED_


#include "kvsim.h"
#include "kvsim_request.h"


int kvs_http_init(kvs_server_t *srv);
void kvs_http_free(kvs_server_t *srv);
/* the scheduler's callback: a token, or the end of a sequence */
void kvs_http_seq_event(kvs_seq_t *seq, int done, void *arg);
/* a request not yet in the scheduler: the error to its client, r freed */
void kvs_http_fail(kvs_req_t *r, int code, const char *msg);


#endif /* _KVSIM_HTTP_H_INCLUDED_ */
