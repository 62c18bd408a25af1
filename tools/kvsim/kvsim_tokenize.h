/*
 * kvsim: POST /tokenize as vLLM serves it, with the pseudo-tokenizer that
 * the token key space uses (kvsim_token.h); late (--tokenize-delay-ms)
 * or failing (--tokenize-fail) on demand, to test what a router does then.
 */

#ifndef _KVSIM_TOKENIZE_H_INCLUDED_
#define _KVSIM_TOKENIZE_H_INCLUDED_


#include <event2/http.h>

#include "kvsim.h"


typedef struct kvs_tok_s  kvs_tok_t;


/*
 * Answers now, or after the delay: *slot then holds the reply waiting,
 * and is set to NULL when it leaves.
 */
void kvs_tokenize(kvs_server_t *srv, struct evhttp_request *req,
    kvs_tok_t **slot);
/* the connection closed under a waiting reply: it is never sent */
void kvs_tokenize_cancel(kvs_tok_t *t);


#endif /* _KVSIM_TOKENIZE_H_INCLUDED_ */
