/*
 * kvsim: KV events to Redis (docs/events.md), resync requests from it.
 *
 * Two hiredis async connections on the libevent loop, one to publish and
 * one subscribed to "<channel>:resync"; both reconnect every second while
 * Redis is away.  Nothing here ever blocks the loop.
 */

#ifndef _KVSIM_EVENTS_H_INCLUDED_
#define _KVSIM_EVENTS_H_INCLUDED_


#include "kvsim.h"


/*
 * Within the receivers' proposed limits (max_hashes=4096, max_events=1024,
 * max_message=256k): a full message is about 78 KB of hashes and 60 KB of
 * event framing.
 */
#define KVS_MSG_HASHES      4096        /* hashes per message at most */
#define KVS_MSG_EVENTS      1024        /* events per message at most */


kvs_events_t *kvs_events_create(kvs_sim_t *sim);
void kvs_events_destroy(kvs_events_t *ev);
/* after a step: publishes what the server's cache did */
void kvs_events_step(kvs_events_t *ev, kvs_server_t *srv);


#endif /* _KVSIM_EVENTS_H_INCLUDED_ */
