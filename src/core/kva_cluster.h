/*
 * kva_cluster: where a channel lives in a Redis Cluster.  The key slot
 * of a name (CRC16 of the name or of its hash tag, modulo 16384, as the
 * cluster specification defines it) and, from a CLUSTER SLOTS reply, the
 * master that owns a slot and the nodes worth trying when it is gone.
 *
 * hiredis has no cluster client; this is all of the cluster a sharded
 * pub/sub client needs.  Pure: no I/O, no allocation.
 */

#ifndef _KVA_CLUSTER_H_INCLUDED_
#define _KVA_CLUSTER_H_INCLUDED_


#include <stddef.h>
#include <stdint.h>


#define KVA_CLUSTER_SLOTS     16384
#define KVA_CLUSTER_HOST_LEN  64        /* an IPv6 address fits */


struct redisReply;


typedef struct {
    char                host[KVA_CLUSTER_HOST_LEN];  /* "": the one asked */
    unsigned            port;
} kva_cluster_node_t;


typedef enum {
    KVA_CLUSTER_OK = 0,                 /* *owner is the slot's master */
    KVA_CLUSTER_UNCOVERED,              /* no range covers the slot */
    KVA_CLUSTER_BAD                     /* not a CLUSTER SLOTS reply */
} kva_cluster_rc_e;


uint16_t kva_cluster_crc16(const unsigned char *p, size_t len);

/* the slot of a key or channel name, its hash tag honoured */
unsigned kva_cluster_slot(const unsigned char *key, size_t len);

/* whether the name has a hash tag: names it prefixes share its slot */
int kva_cluster_has_tag(const unsigned char *key, size_t len);

/*
 * The master of slot in a CLUSTER SLOTS reply (hiredis' redisReply); and
 * up to *nnodes other nodes it names, masters and replicas, each once
 * (*nnodes: in, the room in nodes; out, how many).
 */
kva_cluster_rc_e kva_cluster_owner(const struct redisReply *reply,
    unsigned slot, kva_cluster_node_t *owner, kva_cluster_node_t *nodes,
    size_t *nnodes);

/*
 * The same, the node asked ("" in the reply) written as here, the host
 * the connection reached; *owner_here: whether the owner is that node
 * (here, port), where the link stays, or not, where it moves to owner.
 */
kva_cluster_rc_e kva_cluster_place(const struct redisReply *reply,
    unsigned slot, const char *here, unsigned port, kva_cluster_node_t *owner,
    int *owner_here, kva_cluster_node_t *nodes, size_t *nnodes);


#endif /* _KVA_CLUSTER_H_INCLUDED_ */
