/*
 * kvsim: the OpenAI-compatible HTTP side of one server (evhttp).
 */

#ifndef _KVSIM_HTTP_H_INCLUDED_
#define _KVSIM_HTTP_H_INCLUDED_


#include "kvsim.h"


int kvs_http_init(kvs_server_t *srv);
void kvs_http_free(kvs_server_t *srv);
/* the scheduler's callback: a token, or the end of a sequence */
void kvs_http_seq_event(kvs_seq_t *seq, int done, void *arg);


#endif /* _KVSIM_HTTP_H_INCLUDED_ */
