/*
 * kvsim: a decode server's side of disaggregation: leg 1 run for the
 * client (llm-d's sidecar), the pull from the prefill server (vLLM's
 * params, or SGLang's bootstrap room, waited for), its transfer time, the
 * pulled blocks put into the cache; on any failure, the request served
 * aggregated.
 */

#ifndef _KVSIM_PULL_H_INCLUDED_
#define _KVSIM_PULL_H_INCLUDED_


#include "kvsim_request.h"


/* r->pending: the request is submitted when its blocks are in */
void kvs_pull_start(kvs_req_t *r);
/* the client left (r is freed next), or the request is done */
void kvs_pull_cancel(kvs_req_t *r);
/* the sequence was admitted: the pulled blocks need no pin any more */
void kvs_pull_admitted(kvs_req_t *r);


#endif /* _KVSIM_PULL_H_INCLUDED_ */
