/*
 * kvsim: KV events as vLLM publishes them (--events zmq): per server a PUB
 * socket sending [topic, seq, payload] after every step that changed the
 * cache, and a ROUTER socket answering replay requests from the last
 * --zmq-buffer batches.  Server i binds tcp://127.0.0.1:(P + 2i) and
 * (P + 2i + 1), P the --zmq-port; vLLM binds ports 5557 and 5558 on every
 * address by default.  The ROUTER's ZMQ_FD is on the libevent loop.
 */

#ifndef _KVSIM_ZMQ_H_INCLUDED_
#define _KVSIM_ZMQ_H_INCLUDED_


#include "kvsim.h"


kvs_zmq_t *kvs_zmq_create(kvs_sim_t *sim);
void kvs_zmq_destroy(kvs_zmq_t *z);
/* after a step: publishes what the server's cache did, if anything */
void kvs_zmq_step(kvs_zmq_t *z, kvs_server_t *srv);


#endif /* _KVSIM_ZMQ_H_INCLUDED_ */
