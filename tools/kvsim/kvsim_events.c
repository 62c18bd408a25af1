/*
 * kvsim: KV events to Redis (docs/events.md), resync requests from it.
 *
 * --redis-cluster: the events go by sharded pub/sub.  Each connection
 * asks the node it reached (CLUSTER SLOTS) which master owns the
 * channel's slot and moves there; MOVED, an "sunsubscribe" or a lost
 * node sends it back to ask again (a lost node: the next one known).
 * hiredis 0.14 calls back for a pushed message only on a channel it saw
 * in a SUBSCRIBE, so the resync channel is SUBSCRIBEd as well as
 * SSUBSCRIBEd.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include "kva_cluster.h"
#include "kva_event.h"
#include "kva_rand.h"
#include "kvsim_events.h"
#include "kvsim_server.h"


#define KVS_PENDING_MAX     65536       /* PUBLISH replies outstanding */
#define KVS_NODES           16          /* cluster nodes to try */


/*
 * Where one of the two connections goes: the seed, or the slot's master.
 * Each its own: one may be moving while the other is placed or lost.
 */
typedef struct {
    char                host[KVA_CLUSTER_HOST_LEN];
    unsigned            port;
    unsigned            moving:1;       /* to host: not a failure */
} kvs_place_t;


struct kvs_events_s {
    kvs_sim_t          *sim;
    redisAsyncContext  *pub;
    redisAsyncContext  *sub;
    struct event       *retry;
    struct event       *heartbeat;
    unsigned            pending;
    unsigned            closing:1;
    unsigned            warned:1;
    unsigned            placed:1;       /* pub on the slot's master */
    char                resync[256];

    kvs_place_t         at[2];          /* [0]: pub, [1]: sub */
    unsigned            slot;
    kva_cluster_node_t  nodes[KVS_NODES];   /* [0]: the seed */
    size_t              nnodes;
    size_t              next;

    kva_ev_t           *evs;            /* KVS_MSG_EVENTS */
    uint64_t           *hashes;         /* KVS_MSG_HASHES */
    uint64_t           *snap;           /* num_blocks */
};


static void kvs_flush(kvs_events_t *ev, kvs_server_t *srv);
static void kvs_snapshot(kvs_events_t *ev, kvs_server_t *srv);
static void kvs_publish(kvs_events_t *ev, kvs_server_t *srv,
    kva_batch_t *b);
static int kvs_paused(kvs_events_t *ev);
static void kvs_connect(kvs_events_t *ev);
static redisAsyncContext *kvs_open(kvs_events_t *ev, int sub);
static void kvs_on_connect(const redisAsyncContext *ac, int status);
static void kvs_on_disconnect(const redisAsyncContext *ac, int status);
static kvs_place_t *kvs_place(kvs_events_t *ev,
    const redisAsyncContext *ac);
static void kvs_forget(const redisAsyncContext *ac, const char *what);
static void kvs_lost(kvs_events_t *ev, kvs_place_t *at, const char *what);
static void kvs_on_publish(redisAsyncContext *ac, void *reply, void *arg);
static void kvs_on_resync(redisAsyncContext *ac, void *reply, void *arg);
static void kvs_on_slots(redisAsyncContext *ac, void *reply, void *arg);
static void kvs_moved(redisAsyncContext *ac, const char *why);
static void kvs_retry_handler(evutil_socket_t fd, short what, void *arg);
static void kvs_heartbeat_handler(evutil_socket_t fd, short what,
    void *arg);


kvs_events_t *
kvs_events_create(kvs_sim_t *sim)
{
    kvs_events_t    *ev;
    struct timeval   tv;

    ev = calloc(1, sizeof(kvs_events_t));
    if (ev == NULL) {
        return NULL;
    }

    ev->sim = sim;
    snprintf(ev->resync, sizeof(ev->resync), "%s:resync", sim->conf.channel);

    snprintf(ev->nodes[0].host, sizeof(ev->nodes[0].host), "%s",
             sim->conf.redis_host);
    ev->nodes[0].port = sim->conf.redis_port;
    ev->at[0].port = ev->nodes[0].port;
    memcpy(ev->at[0].host, ev->nodes[0].host, sizeof(ev->at[0].host));
    ev->at[1] = ev->at[0];
    ev->nnodes = 1;
    ev->slot = kva_cluster_slot((const unsigned char *) sim->conf.channel,
                                strlen(sim->conf.channel));

    ev->evs = malloc(KVS_MSG_EVENTS * sizeof(kva_ev_t));
    ev->hashes = malloc(KVS_MSG_HASHES * sizeof(uint64_t));
    ev->snap = malloc(sim->conf.num_blocks * sizeof(uint64_t));
    ev->retry = event_new(sim->base, -1, EV_PERSIST, kvs_retry_handler, ev);
    ev->heartbeat = event_new(sim->base, -1, EV_PERSIST,
                              kvs_heartbeat_handler, ev);

    if (ev->evs == NULL || ev->hashes == NULL || ev->snap == NULL
        || ev->retry == NULL || ev->heartbeat == NULL)
    {
        kvs_events_destroy(ev);
        return NULL;
    }

    tv.tv_sec = 1;
    tv.tv_usec = 0;
    event_add(ev->retry, &tv);

    tv.tv_sec = sim->conf.heartbeat_ms / 1000;
    tv.tv_usec = (sim->conf.heartbeat_ms % 1000) * 1000;
    event_add(ev->heartbeat, &tv);

    kvs_connect(ev);

    return ev;
}


void
kvs_events_destroy(kvs_events_t *ev)
{
    ev->closing = 1;

    /* the disconnect callbacks clear ev->pub and ev->sub */
    if (ev->pub) {
        redisAsyncFree(ev->pub);
        ev->pub = NULL;
    }

    if (ev->sub) {
        redisAsyncFree(ev->sub);
        ev->sub = NULL;
    }

    if (ev->retry) {
        event_free(ev->retry);
    }

    if (ev->heartbeat) {
        event_free(ev->heartbeat);
    }

    free(ev->evs);
    free(ev->hashes);
    free(ev->snap);
    free(ev);
}


void
kvs_events_step(kvs_events_t *ev, kvs_server_t *srv)
{
    if (!kvs_paused(ev)) {
        kvs_flush(ev, srv);
    }
}


static void
kvs_flush(kvs_events_t *ev, kvs_server_t *srv)
{
    size_t        i, nev, nh;
    kvs_op_t     *op;
    kva_ev_t     *e;
    kva_batch_t   b;
    kvs_cache_t  *c = &srv->cache;

    if (c->ops_lost) {
        /* a seq never sent: receivers see a gap and ask for a resync */
        srv->seq++;
        srv->dropped++;
        c->ops_lost = 0;
    }

    i = 0;

    while (i < c->nops || !srv->announced) {
        nev = 0;
        nh = 0;

        if (!srv->announced) {
            /* a (re)started server holds nothing */
            memset(&ev->evs[0], 0, sizeof(kva_ev_t));
            ev->evs[0].type = KVA_EV_CLEARED;
            nev = 1;
            srv->announced = 1;
        }

        for ( /* void */ ; i < c->nops && nh < KVS_MSG_HASHES; i++) {
            op = &c->ops[i];
            e = nev ? &ev->evs[nev - 1] : NULL;

            if (e == NULL
                || e->type != (op->type == KVS_OP_STORED ? KVA_EV_STORED
                                                         : KVA_EV_REMOVED)
                || (op->type == KVS_OP_STORED
                    && op->parent != e->hashes[e->nhashes - 1]))
            {
                /* unchained stores and removals take an event each */
                if (nev == KVS_MSG_EVENTS) {
                    break;
                }

                e = &ev->evs[nev++];
                memset(e, 0, sizeof(kva_ev_t));
                e->type = (op->type == KVS_OP_STORED) ? KVA_EV_STORED
                                                      : KVA_EV_REMOVED;
                e->has_parent = (op->type == KVS_OP_STORED && op->parent);
                e->parent = op->parent;
                e->hashes = &ev->hashes[nh];
            }

            ev->hashes[nh++] = op->hash;
            e->nhashes++;
        }

        memset(&b, 0, sizeof(kva_batch_t));
        b.events = ev->evs;
        b.nevents = nev;
        kvs_publish(ev, srv, &b);
    }

    kvs_cache_ops_clear(c);
}


static void
kvs_snapshot(kvs_events_t *ev, kvs_server_t *srv)
{
    uint32_t     n, i, k;
    kva_batch_t  b;

    n = kvs_cache_snapshot(&srv->cache, ev->snap);

    /* the snapshot says all that the unpublished ops would */
    kvs_cache_ops_clear(&srv->cache);
    srv->announced = 1;

    for (i = 0; i == 0 || i < n; i += k) {
        k = (n - i < KVS_MSG_HASHES) ? n - i : KVS_MSG_HASHES;

        memset(&b, 0, sizeof(kva_batch_t));
        memset(&ev->evs[0], 0, sizeof(kva_ev_t));
        ev->evs[0].type = KVA_EV_STORED;
        ev->evs[0].hashes = &ev->snap[i];
        ev->evs[0].nhashes = k;
        b.events = ev->evs;
        b.nevents = (k > 0);

        if (n <= KVS_MSG_HASHES) {
            b.snapshot = KVA_SNAP_FULL;

        } else {
            b.snapshot = (i == 0) ? KVA_SNAP_BEGIN
                         : (i + k == n) ? KVA_SNAP_END : KVA_SNAP_MORE;
        }

        kvs_publish(ev, srv, &b);

        if (n == 0) {
            break;
        }
    }
}


static void
kvs_publish(kvs_events_t *ev, kvs_server_t *srv, kva_batch_t *b)
{
    char    *msg;
    size_t   len;

    memcpy(b->server, srv->id, srv->id_len);
    b->server_len = srv->id_len;
    /* a data-parallel server's ranks: each its own seq, "rank" always */
    b->has_rank = (ev->sim->conf.data_parallel > 1);
    b->rank = srv->rank;
    b->seq = ++srv->seq;
    b->heartbeat = (b->nevents == 0 && b->snapshot == KVA_SNAP_NONE);
    b->has_load = 1;
    b->waiting = srv->sched.nwaiting;
    b->running = srv->sched.nrunning;
    b->kv_usage = kvs_cache_usage(&srv->cache);
    b->kv_tokens = (uint64_t) srv->sim->conf.num_blocks
                   * srv->sim->conf.block_tokens;

    if (ev->pub == NULL || !ev->placed || ev->pending >= KVS_PENDING_MAX
        || (ev->sim->conf.drop_events > 0.0
            && kva_rand_unit(&ev->sim->rng) < ev->sim->conf.drop_events))
    {
        srv->dropped++;
        return;
    }

    msg = kva_event_encode(b, &len);
    if (msg == NULL) {
        srv->dropped++;
        return;
    }

    if (redisAsyncCommand(ev->pub, kvs_on_publish, ev,
                          ev->sim->conf.redis_cluster ? "SPUBLISH %s %b"
                                                      : "PUBLISH %s %b",
                          ev->sim->conf.channel, msg, len)
        == REDIS_OK)
    {
        ev->pending++;
        srv->published++;

    } else {
        srv->dropped++;
    }

    free(msg);
}


static int
kvs_paused(kvs_events_t *ev)
{
    double  t;

    if (ev->sim->conf.pause_after_ms < 0) {
        return 0;
    }

    t = kvs_now_ms() - ev->sim->t0 - ev->sim->conf.pause_after_ms;

    return t >= 0 && t < ev->sim->conf.pause_ms;
}


static void
kvs_connect(kvs_events_t *ev)
{
    if (ev->pub == NULL) {
        ev->pub = kvs_open(ev, 0);
        ev->placed = (ev->pub != NULL && !ev->sim->conf.redis_cluster);
    }

    if (ev->sub == NULL) {
        ev->sub = kvs_open(ev, 1);
    }
}


static redisAsyncContext *
kvs_open(kvs_events_t *ev, int sub)
{
    redisAsyncContext  *ac;
    kvs_place_t        *at;

    at = &ev->at[sub ? 1 : 0];

    /* an IP address: hiredis does not resolve, the loop never blocks */
    ac = redisAsyncConnect(at->host, (int) at->port);
    if (ac == NULL) {
        return NULL;
    }

    ac->data = ev;

    if (ac->err || redisLibeventAttach(ac, ev->sim->base) != REDIS_OK) {
        kvs_lost(ev, at, ac->errstr);
        redisAsyncFree(ac);
        return NULL;
    }

    redisAsyncSetConnectCallback(ac, kvs_on_connect);
    redisAsyncSetDisconnectCallback(ac, kvs_on_disconnect);

    if (ev->sim->conf.redis_cluster) {
        /* where the slot is first; arg: which of the two this is */
        if (redisAsyncCommand(ac, kvs_on_slots, sub ? &ev->sub : &ev->pub,
                              "CLUSTER SLOTS")
            != REDIS_OK)
        {
            redisAsyncFree(ac);
            return NULL;
        }

    } else if (sub && redisAsyncCommand(ac, kvs_on_resync, ev,
                                        "SUBSCRIBE %s", ev->resync)
                      != REDIS_OK)
    {
        redisAsyncFree(ac);
        return NULL;
    }

    return ac;
}


static void
kvs_on_connect(const redisAsyncContext *ac, int status)
{
    kvs_events_t  *ev = ac->data;
    kvs_place_t   *at;

    if (status != REDIS_OK) {
        kvs_forget(ac, ac->errstr);
        return;
    }

    at = kvs_place(ev, ac);

    if (ev->warned && at != NULL && !ev->sim->conf.quiet) {
        fprintf(stderr, "kvsim: redis %s:%u: connected\n", at->host,
                at->port);
    }

    ev->warned = 0;
}


static void
kvs_on_disconnect(const redisAsyncContext *ac, int status)
{
    kvs_forget(ac, status == REDIS_OK ? "closed" : ac->errstr);
}


/* which of the two ac is; NULL: neither (any more) */
static kvs_place_t *
kvs_place(kvs_events_t *ev, const redisAsyncContext *ac)
{
    if (ev == NULL) {
        return NULL;
    }

    if (ev->pub == ac) {
        return &ev->at[0];
    }

    if (ev->sub == ac) {
        return &ev->at[1];
    }

    return NULL;
}


/* hiredis frees ac after the callback; reconnect in a second */
static void
kvs_forget(const redisAsyncContext *ac, const char *what)
{
    kvs_events_t  *ev = ac->data;
    kvs_place_t   *at;

    at = kvs_place(ev, ac);

    if (at == NULL) {
        return;
    }

    if (ev->pub == ac) {
        ev->pub = NULL;
        ev->placed = 0;

    } else {
        ev->sub = NULL;
    }

    kvs_lost(ev, at, what);
}


static void
kvs_lost(kvs_events_t *ev, kvs_place_t *at, const char *what)
{
    if (at->moving) {
        /* to the slot's master, or back to ask where the slot went */
        at->moving = 0;
        return;
    }

    if (!ev->closing && !ev->warned && !ev->sim->conf.quiet) {
        fprintf(stderr, "kvsim: redis %s:%u: %s, retrying every second\n",
                at->host, at->port, what);
    }

    ev->warned = 1;

    if (ev->sim->conf.redis_cluster) {
        /* the node is gone: the seed and the others, in turn */
        ev->next = (ev->next + 1) % ev->nnodes;
        at->port = ev->nodes[ev->next].port;
        memcpy(at->host, ev->nodes[ev->next].host, sizeof(at->host));
    }
}


static void
kvs_on_publish(redisAsyncContext *ac, void *reply, void *arg)
{
    redisReply    *r = reply;
    kvs_events_t  *ev = arg;

    ev->pending--;

    /* only a MOVED sends it elsewhere: NOPERM or OOM would follow */
    if (r != NULL && r->type == REDIS_REPLY_ERROR
        && strncmp(r->str, "MOVED ", 6) == 0)
    {
        kvs_moved(ac, r->str);
    }
}


/* CLUSTER SLOTS: on the slot's master, publish or subscribe; else go */
static void
kvs_on_slots(redisAsyncContext *ac, void *reply, void *arg)
{
    int                  stay;
    size_t               i, n;
    const char          *here;
    redisReply          *r = reply;
    kvs_events_t        *ev = ac->data;
    kvs_place_t         *at;
    kva_cluster_node_t   owner, nodes[KVS_NODES - 1];

    at = kvs_place(ev, ac);

    if (r == NULL || at == NULL) {
        return;
    }

    n = KVS_NODES - 1;

    /* this connection's node ("" in the reply) */
    here = ac->c.tcp.host ? ac->c.tcp.host : at->host;

    if (kva_cluster_place(r, ev->slot, here, (unsigned) ac->c.tcp.port,
                          &owner, &stay, nodes, &n)
        != KVA_CLUSTER_OK)
    {
        redisAsyncDisconnect(ac);
        return;
    }

    for (i = 0; i < n; i++) {
        ev->nodes[i + 1] = nodes[i];
    }

    ev->nnodes = n + 1;
    ev->next %= ev->nnodes;

    if (!stay) {
        memcpy(at->host, owner.host, sizeof(at->host));
        at->port = owner.port;
        at->moving = 1;
        redisAsyncDisconnect(ac);
        return;
    }

    if (arg == &ev->pub) {
        ev->placed = 1;
        return;
    }

    (void) redisAsyncCommand(ac, kvs_on_resync, ev, "SUBSCRIBE %s",
                             ev->resync);
    (void) redisAsyncCommand(ac, kvs_on_resync, ev, "SSUBSCRIBE %s",
                             ev->resync);
}


/* the slot is no longer the node's: ask it again where it went */
static void
kvs_moved(redisAsyncContext *ac, const char *why)
{
    kvs_events_t  *ev = ac->data;
    kvs_place_t   *at;

    at = kvs_place(ev, ac);

    if (at == NULL || at->moving) {
        return;
    }

    if (!ev->sim->conf.quiet) {
        fprintf(stderr, "kvsim: redis %s:%u: %s: asking the cluster again\n",
                at->host, at->port, why);
    }

    at->moving = 1;
    redisAsyncDisconnect(ac);
}


static void
kvs_on_resync(redisAsyncContext *ac, void *reply, void *arg)
{
    char           server[KVA_EVENT_SERVER_MAX];
    size_t         len;
    unsigned       rank;
    redisReply    *r = reply;
    kvs_events_t  *ev = arg;
    kvs_server_t  *srv;

    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        kvs_moved(ac, r->str);
        return;
    }

    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 3
        && r->element[0]->type == REDIS_REPLY_STRING
        && strcmp(r->element[0]->str, "sunsubscribe") == 0)
    {
        kvs_moved(ac, "the slot moved");
        return;
    }

    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3
        || r->element[0]->type != REDIS_REPLY_STRING
        || (strcmp(r->element[0]->str, "message") != 0
            && strcmp(r->element[0]->str, "smessage") != 0)
        || r->element[2]->type != REDIS_REPLY_STRING)
    {
        return;
    }

    if (kva_event_decode_resync(r->element[2]->str, r->element[2]->len,
                                server, sizeof(server), &len, &rank) != 0)
    {
        return;
    }

    /* without "rank": rank 0, the whole of a server that has no ranks */
    srv = kvs_server_find(ev->sim, server, len, rank);

    if (srv && !kvs_paused(ev)) {
        kvs_snapshot(ev, srv);
    }
}


static void
kvs_retry_handler(evutil_socket_t fd, short what, void *arg)
{
    kvs_connect(arg);
}


static void
kvs_heartbeat_handler(evutil_socket_t fd, short what, void *arg)
{
    unsigned       i;
    kva_batch_t    b;
    kvs_events_t  *ev = arg;
    kvs_server_t  *srv;

    if (kvs_paused(ev)) {
        return;
    }

    for (i = 0; i < ev->sim->nranks; i++) {
        srv = &ev->sim->servers[i];

        if (srv->cache.nops || srv->cache.ops_lost || !srv->announced) {
            kvs_flush(ev, srv);
            continue;
        }

        memset(&b, 0, sizeof(kva_batch_t));
        kvs_publish(ev, srv, &b);
    }
}
