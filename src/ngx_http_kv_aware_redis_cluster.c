/*
 * ngx_http_kv_aware_module: the Redis link on a Redis Cluster
 * (kv_aware_events cluster=on), with sharded pub/sub.
 *
 * A sharded channel lives on the master that owns its key slot: a
 * connection asks the node it reached (CLUSTER SLOTS) and moves to the
 * owner, which is where it SSUBSCRIBEs and SPUBLISHes.  The channel's
 * resync, learned and ping channels share its slot (its hash tag, which
 * the configuration requires), so one node has them all.  When the slot
 * moves (a failover, a resharding), Redis 7 sends an "sunsubscribe" or
 * answers MOVED: the connection goes back to a node and asks again; when
 * a node is gone, the next one the last CLUSTER SLOTS named is tried.
 *
 * hiredis 0.14 knows nothing of sharded pub/sub: it calls back for a
 * pushed message only on a channel it saw in a SUBSCRIBE.  So the
 * subscriber SUBSCRIBEs to the same names too, which also lets through
 * what a publisher PUBLISHes unsharded (the cluster bus takes that to
 * every node).
 */

#include "ngx_http_kv_aware_redis_cluster.h"
#include "kva_cluster.h"


static void ngx_http_kv_aware_cluster_on_slots(redisAsyncContext *ac,
    void *r, void *data);
static void ngx_http_kv_aware_cluster_on_publish(redisAsyncContext *ac,
    void *r, void *data);
static ngx_int_t ngx_http_kv_aware_cluster_addr(
    ngx_http_kv_aware_link_t *link, kva_cluster_node_t *node,
    ngx_http_kv_aware_redis_addr_t *addr);
static void ngx_http_kv_aware_cluster_remember(
    ngx_http_kv_aware_link_t *link, kva_cluster_node_t *nodes, size_t n);


void
ngx_http_kv_aware_cluster_ask(ngx_http_kv_aware_link_t *link)
{
    (void) redisAsyncCommand(link->conn.ac,
                             ngx_http_kv_aware_cluster_on_slots, link,
                             "CLUSTER SLOTS");
}


static void
ngx_http_kv_aware_cluster_on_slots(redisAsyncContext *ac, void *r,
    void *data)
{
    redisReply                      *reply = r;
    ngx_http_kv_aware_link_t        *link = data;

    int                              here;
    size_t                           n;
    kva_cluster_rc_e                 rc;
    kva_cluster_node_t               owner;
    kva_cluster_node_t               nodes[NGX_HTTP_KV_AWARE_CLUSTER_NODES];
    ngx_http_kv_aware_cluster_t     *cl;
    ngx_http_kv_aware_redis_addr_t   addr;

    if (reply == NULL) {
        return;
    }

    cl = link->cluster;
    n = NGX_HTTP_KV_AWARE_CLUSTER_NODES;

    rc = kva_cluster_place(reply, cl->slot, (char *) link->addr.ip,
                           link->addr.port, &owner, &here, nodes, &n);

    if (rc != KVA_CLUSTER_OK) {
        ngx_log_error(NGX_LOG_ERR, cl->log, 0,
                      "kv_aware: redis %s:%ui: CLUSTER SLOTS %s%*s, "
                      "retrying", link->addr.ip, link->addr.port,
                      rc == KVA_CLUSTER_UNCOVERED
                          ? "names no master for the channel's slot"
                          : "answered ",
                      (size_t) (reply->type == REDIS_REPLY_ERROR
                                ? reply->len : 0),
                      reply->type == REDIS_REPLY_ERROR ? reply->str : "");

        /* nothing was subscribed: said once above, not again as a loss */
        link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MAX;
        link->connected = 0;
        redisAsyncDisconnect(ac);
        return;
    }

    ngx_http_kv_aware_cluster_remember(link, nodes, n);

    if (ngx_http_kv_aware_cluster_addr(link, &owner, &addr) != NGX_OK) {
        link->backoff = NGX_HTTP_KV_AWARE_BACKOFF_MAX;
        link->connected = 0;
        redisAsyncDisconnect(ac);
        return;
    }

    if (here) {
        ngx_http_kv_aware_link_subscribe(link);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, cl->log, 0,
                  "kv_aware: redis cluster: slot %ui of \"%V\" is on "
                  "%s:%ui, not %s:%ui: the %s moves there",
                  cl->slot, cl->channel, addr.ip, addr.port,
                  link->addr.ip, link->addr.port,
                  link->subscriber ? "subscriber" : "publisher");

    /* not a loss: nothing was subscribed here */
    link->addr = addr;
    link->moving = 1;
    link->connected = 0;
    redisAsyncDisconnect(ac);
}


/*
 * Both commands name the three channels of one slot.  hiredis gives each
 * confirmation, sharded or not, to link_subscribe()'s message handler,
 * which waits for the sharded one.
 */
void
ngx_http_kv_aware_cluster_subscribe(ngx_http_kv_aware_link_t *link)
{
    ngx_uint_t                       i, n;
    const char                      *argv[5];
    size_t                           argl[5];
    ngx_http_kv_aware_cluster_t     *cl;

    cl = link->cluster;

    n = 1;
    argv[n] = (char *) cl->channel->data;
    argl[n++] = cl->channel->len;
    argv[n] = (char *) cl->ping->data;
    argl[n++] = cl->ping->len;

    if (cl->second->len) {
        argv[n] = (char *) cl->second->data;
        argl[n++] = cl->second->len;
    }

    for (i = 0; i < 2; i++) {
        argv[0] = i ? "SSUBSCRIBE" : "SUBSCRIBE";
        argl[0] = ngx_strlen(argv[0]);

        (void) redisAsyncCommandArgv(link->conn.ac,
                                     ngx_http_kv_aware_link_on_message,
                                     link, (int) n, argv, argl);
    }
}


/* the publisher: resync requests, learned hints, pings */
ngx_int_t
ngx_http_kv_aware_cluster_publish(ngx_http_kv_aware_link_t *link,
    ngx_str_t *channel, u_char *data, size_t len)
{
    if (redisAsyncCommand(link->conn.ac,
                          ngx_http_kv_aware_cluster_on_publish, link,
                          "SPUBLISH %b %b", channel->data, channel->len,
                          data, len)
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Only a MOVED sends the publisher elsewhere.  Any other error (NOPERM
 * from an ACL, OOM, a Redis 6 node without SPUBLISH) would come back from
 * every node alike: it is said now and then, and the connection kept.
 */
static void
ngx_http_kv_aware_cluster_on_publish(redisAsyncContext *ac, void *r,
    void *data)
{
    redisReply                *reply = r;
    ngx_http_kv_aware_link_t  *link = data;

    if (reply == NULL) {
        return;
    }

    if (reply->type != REDIS_REPLY_ERROR) {
        link->moves = 0;
        return;
    }

    if (reply->len > 6 && ngx_strncmp(reply->str, "MOVED ", 6) == 0) {
        ngx_http_kv_aware_cluster_moved(link, reply->str, reply->len);
        return;
    }

    if (ngx_time() - link->refused < NGX_HTTP_KV_AWARE_REFUSED_LOG) {
        return;
    }

    link->refused = ngx_time();

    ngx_log_error(NGX_LOG_ERR, link->cluster->log, 0,
                  "kv_aware: redis %s:%ui refused SPUBLISH: %*s "
                  "(said once in %d s)", link->addr.ip, link->addr.port,
                  (size_t) reply->len, reply->str,
                  NGX_HTTP_KV_AWARE_REFUSED_LOG);
}


/*
 * The node says the slot is no longer its own (MOVED, sunsubscribe): ask
 * it again where it went.  What was subscribed is lost: the consumer
 * learns it from link_lost(), and asks for a resync once back.
 */
void
ngx_http_kv_aware_cluster_moved(ngx_http_kv_aware_link_t *link,
    const char *why, size_t len)
{
    ngx_http_kv_aware_cluster_t  *cl;

    cl = link->cluster;

    if (link->moving || link->conn.ac == NULL) {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, cl->log, 0,
                  "kv_aware: redis %s:%ui: %*s: the %s asks the cluster "
                  "where slot %ui of \"%V\" went",
                  link->addr.ip, link->addr.port, len, why,
                  link->subscriber ? "subscriber" : "publisher",
                  cl->slot, cl->channel);

    link->moving = 1;
    redisAsyncDisconnect(link->conn.ac);
}


/* from link_lost(): where the link connects next */
void
ngx_http_kv_aware_cluster_lost(ngx_http_kv_aware_link_t *link)
{
    ngx_http_kv_aware_cluster_t  *cl;

    cl = link->cluster;

    if (link->moving) {
        /*
         * addr is where to go (or ask) now, at once the first times.
         * Nodes that disagree on the owner (each names the other, a
         * MOVED from a stale view) would have the link bounce between
         * them: past a few moves with no subscription nor publish in
         * between, it waits as after failures.
         */
        link->moving = 0;
        link->moves++;

        link->backoff = (link->moves <= NGX_HTTP_KV_AWARE_MOVES_FREE)
            ? NGX_HTTP_KV_AWARE_BACKOFF_MIN
            : ngx_min(NGX_HTTP_KV_AWARE_BACKOFF_MIN
                      << ngx_min(link->moves - NGX_HTTP_KV_AWARE_MOVES_FREE,
                                 8),
                      NGX_HTTP_KV_AWARE_BACKOFF_MAX);
        return;
    }

    /* the node is gone or hung: the seeds and the others, in turn */
    link->addr = cl->nodes[cl->next++ % cl->nnodes];
}


/* a node's address: CLUSTER SLOTS names the node it came from with "" */
static ngx_int_t
ngx_http_kv_aware_cluster_addr(ngx_http_kv_aware_link_t *link,
    kva_cluster_node_t *node, ngx_http_kv_aware_redis_addr_t *addr)
{
    size_t   len;
#if (NGX_HAVE_INET6)
    u_char   buf[sizeof(struct in6_addr)];
#endif

    len = ngx_strlen(node->host);

    if (len == 0) {
        ngx_memcpy(addr->ip, link->addr.ip, sizeof(addr->ip));
        addr->port = node->port;
        return NGX_OK;
    }

    /* a host name would need DNS, which a worker never waits for */
    if (len >= sizeof(addr->ip)
        || (ngx_inet_addr((u_char *) node->host, len) == INADDR_NONE
#if (NGX_HAVE_INET6)
            && ngx_inet6_addr((u_char *) node->host, len, buf) != NGX_OK
#endif
           ))
    {
        ngx_log_error(NGX_LOG_ERR, link->cluster->log, 0,
                      "kv_aware: redis cluster: node \"%s\" is not an IP "
                      "address (cluster-preferred-endpoint-type ip)",
                      node->host);
        return NGX_ERROR;
    }

    ngx_memcpy(addr->ip, node->host, len + 1);
    addr->port = node->port;

    return NGX_OK;
}


/* the seeds stay first; the others as the node named them */
static void
ngx_http_kv_aware_cluster_remember(ngx_http_kv_aware_link_t *link,
    kva_cluster_node_t *nodes, size_t n)
{
    ngx_http_kv_aware_cluster_t     *cl = link->cluster;

    size_t                           i;
    ngx_uint_t                       k, s;
    ngx_http_kv_aware_redis_addr_t   addr;

    k = cl->nseeds;

    for (i = 0; i < n && k < NGX_HTTP_KV_AWARE_CLUSTER_NODES; i++) {
        if (ngx_http_kv_aware_cluster_addr(link, &nodes[i], &addr) != NGX_OK) {
            continue;
        }

        for (s = 0; s < cl->nseeds; s++) {
            if (addr.port == cl->nodes[s].port
                && ngx_strcmp(addr.ip, cl->nodes[s].ip) == 0)
            {
                break;
            }
        }

        if (s == cl->nseeds) {
            cl->nodes[k++] = addr;
        }
    }

    cl->nnodes = k;
    cl->next %= k;
}
