/*
 * kvsim: replies as an OpenAI-compatible server writes them: a completion
 * whole or as server-sent events, errors, and vLLM's Prometheus metrics.
 */

#ifndef _KVSIM_REPLY_H_INCLUDED_
#define _KVSIM_REPLY_H_INCLUDED_


#include <event2/buffer.h>
#include <event2/http.h>

#include "kvsim_request.h"


/* a streamed answer's status and headers, once */
void kvs_reply_start(kvs_req_t *r);
/* the sequence's latest token as an SSE chunk, and the end after the last */
void kvs_reply_chunk(kvs_req_t *r, struct evbuffer *b, int done);
/* the whole completion, once the sequence is done */
void kvs_reply_body(kvs_req_t *r, struct evbuffer *b);
void kvs_reply_metrics(kvs_server_t *srv, struct evhttp_request *req);
void kvs_reply(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *type, struct evbuffer *body);
void kvs_reply_error(kvs_server_t *srv, struct evhttp_request *req, int code,
    const char *msg);
/* X-Kvsim-Rank: the rank that answered, on a data-parallel server */
void kvs_reply_rank_header(kvs_server_t *srv, struct evhttp_request *req);


#endif /* _KVSIM_REPLY_H_INCLUDED_ */
