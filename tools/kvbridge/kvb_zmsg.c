/*
 * kvbridge: one multipart ZeroMQ message, received without blocking
 * (kvb_zmsg.h).
 */

#include "kvb_zmsg.h"


int
kvb_zmsg_recv(void *sock, kvb_zmsg_t *m, size_t max)
{
    int        more;
    zmq_msg_t  skip;

    m->n = 0;
    m->too_long = 0;
    more = 1;

    max = (max < KVB_ZMSG_PARTS_MAX) ? max : KVB_ZMSG_PARTS_MAX;

    while (more && m->n < max) {
        zmq_msg_init(&m->part[m->n]);

        if (zmq_msg_recv(&m->part[m->n], sock, ZMQ_DONTWAIT) < 0) {
            /* EAGAIN; a message's parts arrive together, so only first */
            zmq_msg_close(&m->part[m->n]);
            break;
        }

        more = zmq_msg_more(&m->part[m->n]);
        m->n++;
    }

    while (more && m->n > 0) {
        m->too_long = 1;
        zmq_msg_init(&skip);
        more = zmq_msg_recv(&skip, sock, ZMQ_DONTWAIT) >= 0
               && zmq_msg_more(&skip);
        zmq_msg_close(&skip);
    }

    return m->n > 0;
}


void
kvb_zmsg_close(kvb_zmsg_t *m)
{
    while (m->n) {
        zmq_msg_close(&m->part[--m->n]);
    }
}
