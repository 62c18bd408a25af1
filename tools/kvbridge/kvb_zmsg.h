/*
 * kvbridge: one multipart ZeroMQ message, received without blocking.
 * Engines send a fixed number of parts ([topic, seq, payload], a replay
 * adds an empty delimiter); a message with more is received whole, so
 * that the next one starts where it should, and said to be too long.
 */

#ifndef _KVB_ZMSG_H_INCLUDED_
#define _KVB_ZMSG_H_INCLUDED_


#include <stddef.h>

#include <zmq.h>


#define KVB_ZMSG_PARTS_MAX  4


typedef struct {
    zmq_msg_t               part[KVB_ZMSG_PARTS_MAX];
    size_t                  n;          /* parts kept */
    unsigned                too_long:1; /* it had more than max */
} kvb_zmsg_t;


/*
 * 1: a message was waiting, its first parts (at most max) are in m, to be
 * closed with kvb_zmsg_close(); 0: nothing was waiting.
 */
int kvb_zmsg_recv(void *sock, kvb_zmsg_t *m, size_t max);
void kvb_zmsg_close(kvb_zmsg_t *m);


#endif /* _KVB_ZMSG_H_INCLUDED_ */
