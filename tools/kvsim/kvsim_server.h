/*
 * kvsim: one simulated server, its cache and scheduler driven by a step
 * timer in simulated time, its HTTP side listening.
 */

#ifndef _KVSIM_SERVER_H_INCLUDED_
#define _KVSIM_SERVER_H_INCLUDED_


#include "kvsim.h"


int kvs_server_init(kvs_sim_t *sim, kvs_server_t *srv, unsigned i);
void kvs_server_free(kvs_server_t *srv);
/* a step may be due: starts the step timer when the server is idle */
void kvs_server_kick(kvs_server_t *srv);
/* a server's rank, by the server's id ("127.0.0.1:port") */
kvs_server_t *kvs_server_find(kvs_sim_t *sim, const char *id, size_t len,
    unsigned rank);
/* the rank of srv's server a request goes to; header NULL if none */
kvs_server_t *kvs_server_rank(kvs_server_t *srv, const char *header);


#endif /* _KVSIM_SERVER_H_INCLUDED_ */
