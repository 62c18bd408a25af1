/*
 * kva_cluster: key slots and CLUSTER SLOTS (see kva_cluster.h).
 */

#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kva_cluster.h"


static int kva_cluster_node(const redisReply *r, kva_cluster_node_t *node);
static void kva_cluster_remember(const kva_cluster_node_t *node,
    kva_cluster_node_t *nodes, size_t room, size_t *n);


/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection */
uint16_t
kva_cluster_crc16(const unsigned char *p, size_t len)
{
    int       bit;
    size_t    i;
    uint16_t  crc;

    crc = 0;

    for (i = 0; i < len; i++) {
        crc ^= (uint16_t) (p[i] << 8);

        for (bit = 0; bit < 8; bit++) {
            crc = (crc & 0x8000) ? (uint16_t) ((crc << 1) ^ 0x1021)
                                 : (uint16_t) (crc << 1);
        }
    }

    return crc;
}


/*
 * The tag is what lies between the first '{' and the first '}' after
 * it, when that is not empty; the whole name otherwise.
 */
static int
kva_cluster_tag(const unsigned char *key, size_t len, size_t *start,
    size_t *end)
{
    size_t  open, close;

    for (open = 0; open < len && key[open] != '{'; open++) {
        /* void */
    }

    if (open == len) {
        return 0;
    }

    for (close = open + 1; close < len && key[close] != '}'; close++) {
        /* void */
    }

    if (close == len || close == open + 1) {
        return 0;
    }

    *start = open + 1;
    *end = close;

    return 1;
}


unsigned
kva_cluster_slot(const unsigned char *key, size_t len)
{
    size_t  start, end;

    if (kva_cluster_tag(key, len, &start, &end)) {
        key += start;
        len = end - start;
    }

    return kva_cluster_crc16(key, len) & (KVA_CLUSTER_SLOTS - 1);
}


int
kva_cluster_has_tag(const unsigned char *key, size_t len)
{
    size_t  start, end;

    return kva_cluster_tag(key, len, &start, &end);
}


/*
 * CLUSTER SLOTS: an array of ranges, each [first, last, master, replica
 * ...], a node [host, port, id, ...].
 */
kva_cluster_rc_e
kva_cluster_owner(const struct redisReply *reply, unsigned slot,
    kva_cluster_node_t *owner, kva_cluster_node_t *nodes, size_t *nnodes)
{
    int                  owns;
    size_t               i, j, room;
    kva_cluster_rc_e     rc;
    kva_cluster_node_t   node;
    const redisReply    *range;

    room = *nnodes;
    *nnodes = 0;
    rc = KVA_CLUSTER_UNCOVERED;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
        return KVA_CLUSTER_BAD;
    }

    for (i = 0; i < reply->elements; i++) {
        range = reply->element[i];

        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3
            || range->element[0]->type != REDIS_REPLY_INTEGER
            || range->element[1]->type != REDIS_REPLY_INTEGER)
        {
            return KVA_CLUSTER_BAD;
        }

        owns = range->element[0]->integer <= (long long) slot
               && (long long) slot <= range->element[1]->integer;

        for (j = 2; j < range->elements; j++) {
            if (!kva_cluster_node(range->element[j], &node)) {
                /*
                 * A replica or another range's master this link cannot
                 * use (a long host name, a bad port) is only one less
                 * node to try: the reply is refused for the owner alone.
                 */
                if (j == 2 && owns) {
                    return KVA_CLUSTER_BAD;
                }

                continue;
            }

            if (j == 2 && owns) {
                *owner = node;
                rc = KVA_CLUSTER_OK;
            }

            kva_cluster_remember(&node, nodes, room, nnodes);
        }
    }

    return rc;
}


kva_cluster_rc_e
kva_cluster_place(const struct redisReply *reply, unsigned slot,
    const char *here, unsigned port, kva_cluster_node_t *owner,
    int *owner_here, kva_cluster_node_t *nodes, size_t *nnodes)
{
    size_t            i;
    kva_cluster_rc_e  rc;

    rc = kva_cluster_owner(reply, slot, owner, nodes, nnodes);

    if (rc != KVA_CLUSTER_OK) {
        return rc;
    }

    for (i = 0; i < *nnodes; i++) {
        if (nodes[i].host[0] == '\0') {
            snprintf(nodes[i].host, KVA_CLUSTER_HOST_LEN, "%s", here);
        }
    }

    if (owner->host[0] == '\0') {
        snprintf(owner->host, KVA_CLUSTER_HOST_LEN, "%s", here);
    }

    *owner_here = (owner->port == port && strcmp(owner->host, here) == 0);

    return KVA_CLUSTER_OK;
}


static int
kva_cluster_node(const redisReply *r, kva_cluster_node_t *node)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2
        || r->element[0]->type != REDIS_REPLY_STRING
        || r->element[1]->type != REDIS_REPLY_INTEGER
        || r->element[0]->len >= KVA_CLUSTER_HOST_LEN
        || r->element[1]->integer <= 0 || r->element[1]->integer > 65535)
    {
        return 0;
    }

    memcpy(node->host, r->element[0]->str, r->element[0]->len);
    node->host[r->element[0]->len] = '\0';
    node->port = (unsigned) r->element[1]->integer;

    return 1;
}


static void
kva_cluster_remember(const kva_cluster_node_t *node,
    kva_cluster_node_t *nodes, size_t room, size_t *n)
{
    size_t  i;

    for (i = 0; i < *n; i++) {
        if (nodes[i].port == node->port
            && strcmp(nodes[i].host, node->host) == 0)
        {
            return;
        }
    }

    if (*n < room) {
        nodes[(*n)++] = *node;
    }
}
